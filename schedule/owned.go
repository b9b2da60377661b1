package schedule

import (
	"github.com/cronstream/cronstream/contract"
	"github.com/cronstream/cronstream/internal/clock"
)

// OwnedShards is a set of shards a replica owns, as its ownership hands it
// to the firing loop and the stall detector. It is shared: never change
// it.
type OwnedShards struct {
	// Version changes whenever the set does.
	Version uint64
	// Until is, per shard, until when (monotonic) its lease is valid by
	// this replica's clock: its entries are not fired after it unless the
	// lease was renewed since.
	Until map[contract.Shard]clock.Mono
}
