package region

// Priority orders the background pull. The region tells it which chunks
// the program reached (Accessed) and asks it for chunks to pull (Next),
// skipping those already local or on their way; once Next has nothing
// more, the region pulls what is still missing in file order. Calls come
// one at a time, under the region's lock: they must not block.
type Priority interface {
	Init(chunks int)
	Accessed(chunk int)
	Next() (chunk int, ok bool)
}

// Outward pulls outward from the chunks the program reached, the most
// recently reached first, both ways at once; before any is reached, from
// the start of the file. The default.
func Outward() Priority { return &outward{} }

type step struct{ at, dir int }

type outward struct {
	n        int
	fresh    []step // from accesses, the latest last
	queue    []step // walks under way
	up, down []bool // a walk upwards (downwards) has passed the chunk
	cursor   int
}

func (o *outward) Init(n int) {
	o.n, o.up, o.down = n, make([]bool, n), make([]bool, n)
}

func (o *outward) Accessed(c int) {
	if c < 0 || c >= o.n {
		return
	}
	// The latest access goes first: programs work near what they touched last.
	o.fresh = append(o.fresh, step{c - 1, -1}, step{c + 1, 1})
}

func (o *outward) Next() (int, bool) {
	for len(o.fresh)+len(o.queue) > 0 {
		var s step
		if n := len(o.fresh); n > 0 {
			s, o.fresh = o.fresh[n-1], o.fresh[:n-1]
		} else {
			s, o.queue = o.queue[0], o.queue[1:]
		}
		if s.at < 0 || s.at >= o.n {
			continue
		}
		seen := o.up
		if s.dir < 0 {
			seen = o.down
		}
		if seen[s.at] {
			continue
		}
		seen[s.at] = true
		o.queue = append(o.queue, step{s.at + s.dir, s.dir})
		return s.at, true
	}
	if o.cursor < o.n {
		o.cursor++
		return o.cursor - 1, true
	}
	return 0, false
}

// Sequential pulls in file order.
func Sequential() Priority { return &sequential{} }

type sequential struct{ n, cursor int }

func (s *sequential) Init(n int)   { s.n = n }
func (s *sequential) Accessed(int) {}
func (s *sequential) Next() (int, bool) {
	if s.cursor >= s.n {
		return 0, false
	}
	s.cursor++
	return s.cursor - 1, true
}

// ByRank pulls in the order of rank, highest first (a program that knows
// its layout: headers before data), ties in file order.
func ByRank(rank func(chunk int) int) Priority { return &byRank{rank: rank} }

type byRank struct {
	rank  func(int) int
	order []int
}

func (b *byRank) Init(n int) {
	b.order = make([]int, n)
	ranks := make([]int, n)
	for i := range b.order {
		b.order[i], ranks[i] = i, b.rank(i)
	}
	sortStable(b.order, func(x, y int) bool { return ranks[x] > ranks[y] })
}
func (b *byRank) Accessed(int) {}
func (b *byRank) Next() (int, bool) {
	if len(b.order) == 0 {
		return 0, false
	}
	c := b.order[0]
	b.order = b.order[1:]
	return c, true
}
