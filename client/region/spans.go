package region

// span is a byte range [lo, hi) of one chunk, relative to its start.
type span struct{ lo, hi int }

const (
	// spanGap is the distance under which two written ranges of a chunk
	// are pushed as one: a write command of its own costs about as many
	// bytes around its data.
	spanGap = 32
	// maxSpans bounds the ranges kept per chunk; beyond it the chunk is
	// pushed as the one range from its first written byte to its last.
	maxSpans = 64
)

// addSpan returns ss (sorted, apart by more than spanGap) with [lo, hi)
// added.
func addSpan(ss []span, lo, hi int) []span {
	if lo >= hi {
		return ss
	}
	out := ss[:0:0]
	i := 0
	for ; i < len(ss) && ss[i].hi+spanGap < lo; i++ {
		out = append(out, ss[i])
	}
	for ; i < len(ss) && ss[i].lo <= hi+spanGap; i++ {
		lo, hi = min(lo, ss[i].lo), max(hi, ss[i].hi)
	}
	out = append(out, span{lo, hi})
	out = append(out, ss[i:]...)
	if len(out) > maxSpans {
		out = []span{{out[0].lo, out[len(out)-1].hi}}
	}
	return out
}

// mergeSpans returns the union of a and b.
func mergeSpans(a, b []span) []span {
	out := append([]span(nil), a...)
	for _, s := range b {
		out = addSpan(out, s.lo, s.hi)
	}
	return out
}

// spanBytes is the number of bytes ss covers.
func spanBytes(ss []span) int64 {
	var n int64
	for _, s := range ss {
		n += int64(s.hi - s.lo)
	}
	return n
}
