package scheduler

import (
	"sync"

	"github.com/cronstream/cronstream/internal/taskstate"
)

// takeRoom returns a batch's buffers with room for n fires, reused from
// earlier passes when one is big enough: a fire is large, and its fired
// record's data is copied into the batch (passCall.fired), so every pass
// would otherwise allocate all of its fires and their data anew. Only the
// loop goroutine uses the pool.
func (s *Scheduler) takeRoom(n int) passRoom {
	for i := len(s.rooms) - 1; i >= 0; i-- {
		if r := s.rooms[i]; cap(r.fires) >= n {
			s.rooms = append(s.rooms[:i], s.rooms[i+1:]...)
			return r
		}
	}
	return passRoom{fires: make([]taskstate.Fire, 0, n)}
}

// putRoom returns a batch's buffers to the pool, emptied (fireBatch
// cleared them, so they hold no message or record alive); the pool keeps
// what one pass used, up to maxRooms.
func (s *Scheduler) putRoom(r passRoom) {
	if len(s.rooms) >= maxRooms {
		return
	}
	s.rooms = append(s.rooms, passRoom{fires: r.fires[:0], results: r.results[:0], fired: r.fired[:0]})
}

const maxRooms = 64

// takeSent returns storage for a batch's fires with their results
// (passCall.sent), from what the passes before used, to be filled by
// fireBatch.
func (s *Scheduler) takeSent() []sentFire {
	if n := len(s.sents); n > 0 {
		sent := s.sents[n-1]
		s.sents = s.sents[:n-1]
		return sent
	}
	return nil
}

// putSent keeps a batch's applied fires' storage for takeSent, emptied,
// up to maxRooms of them.
func (s *Scheduler) putSent(sent []sentFire) {
	if len(s.sents) >= maxRooms || cap(sent) == 0 {
		return
	}
	clear(sent)
	s.sents = append(s.sents, sent[:0])
}

// fireMessages recycles the task messages of scheduled fires: a message is
// only read while its fire is sent (taskstate encodes it), and a burst
// would otherwise allocate one per fire.
var fireMessages = sync.Pool{New: func() any { return new(taskstate.TaskMessage) }}
