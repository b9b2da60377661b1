package schedule

import "hash/fnv"

// primaryOf returns the replica that fires entry on time: the one with the
// highest rendezvous hash of (entry, replica) among the live replicas.
// Every replica that sees the same live set picks the same primary, and when
// a replica leaves only its own entries move.
func primaryOf(entry string, live []string) string {
	var best string
	var bestScore uint64
	for _, r := range live {
		h := fnv.New64a()
		h.Write([]byte(entry))
		h.Write([]byte{0})
		h.Write([]byte(r))
		// fnv's low bits mix poorly for similar inputs; finish with a
		// 64-bit mixer so the spread is even.
		s := mix64(h.Sum64())
		if best == "" || s > bestScore || (s == bestScore && r < best) {
			best, bestScore = r, s
		}
	}
	return best
}

// PrimaryOf is primaryOf for other components that share work among the
// live replicas by the same rule: key names the work.
func PrimaryOf(key string, live []string) string { return primaryOf(key, live) }

// mix64 is the splitmix64 finaliser.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
