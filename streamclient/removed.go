package streamclient

import (
	"context"
	"fmt"
	"time"

	"github.com/cronstream/cronstream/contract"
)

// Removal is an entry's last config event when that event is a removal.
type Removal struct {
	Revision uint64    // stream sequence of the removal
	Time     time.Time // when the stream stored it
}

// LastRemoval reads entry id's last config event from the stream leader (one
// message, the subject's last) and returns it when it is a valid removal.
// ok is false when the entry was never written, is registered, or its last
// event cannot be applied (a quarantined entry is not a removed one).
func (c *Client) LastRemoval(ctx context.Context, id string) (Removal, bool, error) {
	if err := contract.ValidateListedID(id); err != nil {
		return Removal{}, false, fmt.Errorf("last removal: %w", err)
	}
	cur, err := c.read(ctx, id, true)
	if err != nil {
		return Removal{}, false, fmt.Errorf("read last config event of entry %q: %w", id, err)
	}
	if cur.err != nil || cur.entry == nil || !cur.entry.Removed {
		return Removal{}, false, nil
	}
	return Removal{Revision: cur.base, Time: cur.time}, true, nil
}
