// Package audit replays cronstream's audit log: the events of both streams,
// <P>_CONFIG (every configuration change) and <P>_ACTIVITY (fires, skips,
// recoveries), merged in the order the streams stored them.
//
// Open starts a Reader with the filters of `cronstream audit` (an entry, a
// queue, event types, a time range, the first or last N events); Next
// returns one Record at a time. A Reader reads the history up to the moment
// it was opened and then reports io.EOF; with Params.Follow it goes on with
// what either stream stores next, for as long as the caller keeps calling
// Next:
//
//	r, err := audit.Open(ctx, js, audit.Params{Entry: "report", Follow: true})
//	if err != nil { ... }
//	defer r.Close()
//	for {
//		rec, err := r.Next(ctx)
//		if errors.Is(err, io.EOF) {
//			continue // the history is read; what follows is live
//		}
//		if err != nil { ... }
//		...
//	}
//
// Records carry the stored CloudEvent as it is (Data) and decoded (Event), so
// an event of a type this version does not know, or a message that is not an
// event at all, is returned rather than dropped.
//
// It only reads: each stream through an ordered consumer that Close deletes
// (and that the server forgets a minute after a reader vanishes).
package audit
