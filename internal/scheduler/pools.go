package scheduler

import (
	"sync"

	"github.com/cronstream/cronstream/internal/taskstate"
)

// fireBuf returns an empty slice of fires with room for n, reused from
// earlier passes when one is big enough: a fire is large, and every pass
// would otherwise allocate all of its fires anew. Only the loop goroutine
// uses the pool.
func (s *Scheduler) fireBuf(n int) []taskstate.Fire {
	for i := len(s.fireBufs) - 1; i >= 0; i-- {
		if b := s.fireBufs[i]; cap(b) >= n {
			s.fireBufs = append(s.fireBufs[:i], s.fireBufs[i+1:]...)
			return b
		}
	}
	return make([]taskstate.Fire, 0, n)
}

// putFireBuf returns a slice to the pool, cleared so it holds no message
// or record alive; the pool keeps what one pass used, up to maxFireBufs.
func (s *Scheduler) putFireBuf(b []taskstate.Fire) {
	if len(s.fireBufs) >= maxFireBufs {
		return
	}
	clear(b)
	s.fireBufs = append(s.fireBufs, b[:0])
}

const maxFireBufs = 64

// fireMessages recycles the task messages of scheduled fires: a message is
// only read while its fire is sent (taskstate encodes it), and a burst
// would otherwise allocate one per fire.
var fireMessages = sync.Pool{New: func() any { return new(taskstate.TaskMessage) }}
