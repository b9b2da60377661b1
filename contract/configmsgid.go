package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"
)

// ConfigMessageID identifies the config stream message stored on subject at
// stored (the stream's timestamp of the message): 12 hex digits of a SHA-256
// of both. Redis keeps it beside each config sequence it holds (the revision
// fence), so a replica can tell a sequence of this config stream from the
// same sequence of an earlier one (deleted and recreated, or restored from
// an older snapshot): it reads the message at that sequence and compares.
// The stream's timestamp is kept in a snapshot and differs for any message
// stored anew, even with the same subject and data.
func ConfigMessageID(subject string, stored time.Time) string {
	h := sha256.New()
	h.Write([]byte(subject))
	h.Write([]byte{0})
	h.Write(strconv.AppendInt(nil, stored.UnixNano(), 10))
	sum := h.Sum(nil)
	return hex.EncodeToString(sum[:6])
}
