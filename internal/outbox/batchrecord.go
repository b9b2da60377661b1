package outbox

import "bytes"

// BatchRecordTag starts a batch record: the tag, then the JSON array of
// events (events.SplitEvents) that the relay publishes as one message
// under the record's id. The recover script writes one per move of a
// queue's tasks (internal/taskstate). A relay from before batches reads
// the tag as a newer compact form and leaves the record for a newer relay.
const BatchRecordTag = "B1 "

// BatchEvents returns the JSON array a batch record carries.
func BatchEvents(rec []byte) ([]byte, bool) {
	return bytes.CutPrefix(rec, []byte(BatchRecordTag))
}
