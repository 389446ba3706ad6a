package region

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
)

var errEOF = io.EOF

const (
	stateOpen = iota
	stateFrozen
	stateHandedOff
	stateClosed
)

// maxBatch is the most chunk data one push or fetch carries: under the
// one-message limit with room for the command around it.
const maxBatch = pb.MaxMessageData - 64<<10

// chunk is the region's knowledge of one chunk. known is the hash of
// the content the cluster had when the chunk was last fetched or pushed
// (valid with hasKnown); dirtyFrom is the write generation that made it
// differ from known (0: clean); pushFrom that of a push in flight.
// spans are the bytes written since dirtyFrom, sending those of the push
// in flight: outside them the local chunk holds what the cluster has.
type chunk struct {
	present, fetching, pushing bool
	hasKnown                   bool
	known                      Hash
	dirtyFrom, pushFrom        uint64
	spans, sending             []span
	epoch                      uint64 // the capability epoch of its first uncommitted write
	// sinceLeech: changed in the cluster, or to be, since the leecher
	// registered (what a handoff reports). ackAt: when a push of it was
	// last committed.
	sinceLeech bool
	ackAt      time.Time
	// staleBelow: a fetch issued before this fetch sequence number may
	// carry content older than the cluster's (the handoff reported the
	// chunk changed); its answer is dropped.
	staleBelow uint64
}

// Region is a file kept in local memory; see the package comment.
//
// Lock order: Region.mu before the client's locks (it calls Caps while
// holding mu; the Caps callbacks take mu without holding Caps' lock).
type Region struct {
	c    *client.Client
	path string
	ino  uint64
	opts Options

	size int64
	cs   int
	mem  []byte

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu                     sync.Mutex
	ch                     []chunk       // guarded by mu
	byHash                 map[Hash]int  // a present clean chunk with that content; guarded by mu
	inflight               map[Hash]int  // fetches under way by content; guarded by mu
	local                  int           // present chunks; guarded by mu
	wake                   chan struct{} // closed when chunks arrive or pushes end; guarded by mu
	urgent                 []int         // chunks to pull before the priority's; guarded by mu
	scanAt                 int           // the file-order pull's position; guarded by mu
	wgen                   uint64        // write generation; guarded by mu
	epoch                  uint64        // the capability's epoch (0: not held); guarded by mu
	lost                   bool          // the capability may have gone since epoch; guarded by mu
	writable               bool          // guarded by mu
	auth                   bool          // known hashes are the committed ones (the capability is held); guarded by mu
	err                    error         // guarded by mu
	state                  int           // guarded by mu
	view                   bool          // guarded by mu
	marked                 bool          // guarded by mu
	push                   chan struct{} // kicks the pusher
	waiters                int           // Syncs waiting; guarded by mu
	pulled                 int64         // guarded by mu
	pushed                 int64         // guarded by mu
	leecher                uint64        // the leecher seen registered; guarded by mu
	fetchSeq               uint64        // fetches issued; guarded by mu
	lastReport             time.Time     // guarded by mu
	lastPulled, lastPushed int64         // guarded by mu
}

func newRegion(c *client.Client, path string, ino uint64, opts Options) *Region {
	r := &Region{c: c, path: path, ino: ino, opts: opts, byHash: map[Hash]int{}, inflight: map[Hash]int{},
		wake: make(chan struct{}), push: make(chan struct{}, 1), lastReport: time.Now()}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	if caps := c.Caps(); caps != nil {
		caps.OnRecall(r.onRecall)
		caps.OnRelease(r.onRelease)
	}
	return r
}

// query asks for the region state.
func (r *Region) query(ctx context.Context, q *pb.RegionQuery) (*pb.RegionState, error) {
	q.Ino = r.ino
	res, err := r.c.Query(ctx, &pb.Query{Q: &pb.Query_Region{Region: q}})
	if err != nil {
		return nil, fmt.Errorf("region %s: %w", r.path, err)
	}
	if res.GetRegion() == nil {
		return nil, fmt.Errorf("region %s: a node answered without a region state: %w", r.path, syscall.EPROTO)
	}
	return res.GetRegion(), nil
}

// hashes reads the committed hashes of every chunk.
func (r *Region) hashes(ctx context.Context) ([]Hash, *pb.RegionState, error) {
	var out []Hash
	var first *pb.RegionState
	for {
		st, err := r.query(ctx, &pb.RegionQuery{First: uint64(len(out)), Count: 1 << 14})
		if err != nil {
			return nil, nil, err
		}
		if first == nil {
			first = st
		}
		for _, h := range st.Hashes {
			var x Hash
			copy(x[:], h)
			out = append(out, x)
		}
		cs := uint64(max(st.ChunkSize, 1))
		if uint64(len(out)) >= (first.Size+cs-1)/cs || len(st.Hashes) == 0 {
			return out, first, nil
		}
	}
}

// load learns the file's size, chunk size and hashes and maps the memory.
func (r *Region) load(ctx context.Context) error {
	hs, st, err := r.hashes(ctx)
	if err != nil {
		return err
	}
	if st.ChunkSize == 0 || st.ChunkSize > maxBatch/2 {
		return fmt.Errorf("region: chunk size %d unsupported: %w", st.ChunkSize, syscall.EINVAL)
	}
	r.size, r.cs = int64(st.Size), int(st.ChunkSize)
	n := int((r.size + int64(r.cs) - 1) / int64(r.cs))
	mem, err := allocMem(n * r.cs)
	if err != nil {
		return err
	}
	r.mem = mem
	r.ch = make([]chunk, n)
	for i := range r.ch {
		if i < len(hs) {
			r.ch[i].known, r.ch[i].hasKnown = hs[i], true
		}
	}
	r.opts.Priority.Init(n)
	r.auth = !r.opts.ReadOnly && r.epoch != 0
	return nil
}

// grant takes the exclusive capability and waits until it can be
// trusted. A grant the change stream's first event overtook is dropped
// by the client (recalls before it were not seen): then again.
func (r *Region) grant(ctx context.Context) error {
	caps := r.c.Caps()
	backoff := time.Millisecond
	for try := 0; ; try++ {
		got, err := caps.GrantExclusive(ctx, r.ino)
		if err != nil {
			return fmt.Errorf("region %s: %w", r.path, err)
		}
		if !slices.Contains(got, r.ino) {
			// Refused while a recall of the file is in flight (this
			// session's own, whose release has not landed yet, or
			// another's): it passes within a lease.
			select {
			case <-time.After(backoff):
				backoff = min(2*backoff, 50*time.Millisecond)
				try--
				continue
			case <-ctx.Done():
				return fmt.Errorf("region %s: capability refused: %w (%w)", r.path, syscall.EBUSY, ctx.Err())
			}
		}
		if !caps.WaitTrusted(ctx, time.Minute) {
			return fmt.Errorf("region %s: capability not trusted: %w", r.path, syscall.ETIMEDOUT)
		}
		if epoch, ok := caps.ExclusiveEpoch(r.ino); ok {
			r.mu.Lock()
			r.epoch, r.lost = epoch, false
			r.mu.Unlock()
			return nil
		}
		if try == 5 {
			return fmt.Errorf("region %s: capability lost at once: %w", r.path, syscall.EAGAIN)
		}
	}
}

// holding reports whether reads and writes may be answered now.
func (r *Region) holding() bool {
	if r.opts.ReadOnly {
		return r.state == stateOpen
	}
	return r.state == stateOpen && !r.lost && r.c.Caps().HeldExclusive(r.ino)
}

// hold waits until the region may answer: open (not frozen by a
// handoff) and holding its capability, taking it back when it went.
func (r *Region) hold(ctx context.Context) error {
	for {
		r.mu.Lock()
		st, lost, wake := r.state, r.lost, r.wake
		ok := r.holding()
		r.mu.Unlock()
		switch {
		case st == stateHandedOff:
			return ErrHandedOff
		case st == stateClosed:
			return ErrClosed
		case ok:
			return nil
		case st == stateFrozen:
			select {
			case <-wake:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := r.grant(ctx); err != nil {
			return err
		}
		if lost {
			// Another session may have changed the file meanwhile.
			if err := r.revalidate(ctx); err != nil {
				return err
			}
			// What is dirty now was written through the view after
			// the release had committed the rest: it goes under the
			// capability held from now on.
			r.mu.Lock()
			for i := range r.ch {
				if c := &r.ch[i]; c.dirtyFrom != 0 && !c.pushing && c.epoch == 0 {
					c.epoch = r.epoch
				}
			}
			r.mu.Unlock()
			r.kickPush()
		}
	}
}

// revalidate drops the local chunks whose committed hash is no longer
// the one they were fetched or pushed with.
func (r *Region) revalidate(ctx context.Context) error {
	_, err := r.revalidateCount(ctx)
	return err
}

// revalidateCount is revalidate, counting the chunks whose hash changed.
func (r *Region) revalidateCount(ctx context.Context) (int, error) {
	hs, _, err := r.hashes(ctx)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.auth = true
	n := 0
	for i := range r.ch {
		c := &r.ch[i]
		var h Hash
		if i < len(hs) {
			h = hs[i]
		}
		if c.hasKnown && c.known == h {
			continue
		}
		n++
		fetching := c.fetching
		r.settle(i)
		c.known, c.hasKnown = h, true
		if c.dirtyFrom != 0 || c.pushing {
			// Written here on a content that is no longer the
			// cluster's: the ranges written do not make the two equal.
			c.spans = []span{{0, len(r.chunkMem(i))}}
		}
		if fetching {
			r.claim(i)
		}
		if c.present && c.dirtyFrom == 0 && !c.pushing {
			r.drop(i)
			r.urgent = append(r.urgent, i)
		}
	}
	r.notify()
	return n, nil
}

// revalidateChunks drops the chunks the handoff reported changed since
// they were pulled; their hashes are learnt when they are fetched again,
// and fetches under way for them are dropped when they answer.
func (r *Region) revalidateChunks(changed []uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.auth = true
	for _, x := range changed {
		if x >= uint64(len(r.ch)) {
			continue
		}
		i := int(x)
		c := &r.ch[i]
		fetching := c.fetching
		r.settle(i)
		if c.present && c.dirtyFrom == 0 && !c.pushing {
			r.drop(i)
		}
		c.known, c.hasKnown = Hash{}, false
		c.fetching = fetching // settled: its answer counts nowhere
		c.staleBelow = r.fetchSeq + 1
		if !c.present {
			r.urgent = append(r.urgent, i)
		}
	}
	r.notify()
}

func (r *Region) drop(i int) {
	c := &r.ch[i]
	if c.present {
		c.present = false
		r.local--
		if j, ok := r.byHash[c.known]; ok && j == i {
			delete(r.byHash, c.known)
		}
	}
}

// notify wakes whoever waits for chunks, pushes or state.
func (r *Region) notify() {
	close(r.wake)
	r.wake = make(chan struct{})
}

func (r *Region) chunks(off int64, n int) (int, int) {
	return int(off / int64(r.cs)), int((off + int64(n) - 1) / int64(r.cs))
}

func (r *Region) allPresent(off int64, n int) bool {
	if n == 0 {
		return true
	}
	a, b := r.chunks(off, n)
	for i := a; i <= b; i++ {
		if !r.ch[i].present {
			return false
		}
	}
	return true
}

// coveredOrPresent: every chunk [off, off+n) touches is local or written whole.
func (r *Region) coveredOrPresent(off int64, n int) bool {
	if n == 0 {
		return true
	}
	a, b := r.chunks(off, n)
	for i := a; i <= b; i++ {
		if !r.ch[i].present && !r.whole(i, off, n) {
			return false
		}
	}
	return true
}

// whole reports whether [off, off+n) covers chunk i entirely.
func (r *Region) whole(i int, off int64, n int) bool {
	lo, hi := int64(i)*int64(r.cs), min(int64(i+1)*int64(r.cs), r.size)
	return off <= lo && off+int64(n) >= hi
}

// write copies p into the region at off and marks the chunks dirty.
func (r *Region) write(p []byte, off int64) {
	if len(p) == 0 {
		return
	}
	r.wgen++
	copy(r.mem[off:], p)
	a, b := r.chunks(off, len(p))
	for i := a; i <= b; i++ {
		lo := int64(i) * int64(r.cs)
		hi := min(lo+int64(r.cs), r.size)
		if !r.ch[i].present {
			// Written whole: what the cluster had does not matter.
			if off > lo || off+int64(len(p)) < hi {
				clear(r.mem[max(lo, off+int64(len(p))):hi])
			}
			r.ch[i].present = true
			r.local++
			r.dirty(i, 0, int(hi-lo))
		} else {
			r.dirty(i, int(max(off, lo)-lo), int(min(off+int64(len(p)), hi)-lo))
		}
		r.opts.Priority.Accessed(i)
	}
	r.kickPush()
}

// dirty marks bytes [lo, hi) of chunk i written at the current
// generation.
func (r *Region) dirty(i, lo, hi int) {
	c := &r.ch[i]
	c.spans = addSpan(c.spans, lo, hi)
	if j, ok := r.byHash[c.known]; ok && j == i {
		delete(r.byHash, c.known)
	}
	if c.dirtyFrom == 0 {
		c.dirtyFrom = r.wgen
		// Written (through the view) while the capability is going or
		// gone: under none yet; the next Sync takes it back for them.
		c.epoch = r.epoch
		if r.lost {
			c.epoch = 0
		}
	}
	if r.leecher != 0 {
		c.sinceLeech = true
	}
}

func (r *Region) kickPush() {
	select {
	case r.push <- struct{}{}:
	default:
	}
}

// ensure makes the chunks of [off, off+n) local, fetching at once those
// neither local nor on their way (post-copy). With forWrite, chunks the
// range covers whole are not needed.
func (r *Region) ensure(ctx context.Context, off int64, n int, forWrite bool) error {
	if n == 0 {
		return nil
	}
	a, b := r.chunks(off, n)
	for {
		var claim []int
		waiting := false
		r.mu.Lock()
		if r.mem == nil {
			r.mu.Unlock()
			return ErrClosed
		}
		var own []int
		for i := a; i <= b; i++ {
			c := &r.ch[i]
			if b-a < 16 && (!forWrite || !r.whole(i, off, n)) {
				r.opts.Priority.Accessed(i)
			}
			switch {
			case c.present || forWrite && r.whole(i, off, n):
			case c.fetching && forWrite && b-a < 4:
				// A puller's batch has it, with up to 1 MiB of other
				// chunks: a write fetches its few chunks itself rather
				// than wait for the batch.
				own = append(own, i)
			case c.fetching || r.sameInFlight(i):
				waiting = true
			case r.fromLocal(i):
			default:
				r.claim(i)
				claim = append(claim, i)
			}
		}
		wake := r.wake
		r.mu.Unlock()
		if len(claim) > 0 || len(own) > 0 {
			if err := r.fetch(ctx, append(claim, own...)); err != nil {
				return err
			}
			continue
		}
		if !waiting {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-r.ctx.Done():
			return ErrClosed
		}
	}
}

// fromLocal fills chunk i without the network when it can: a hole, a
// chunk of this region with the same content, or the cache.
func (r *Region) fromLocal(i int) bool {
	c := &r.ch[i]
	if !c.hasKnown {
		return false
	}
	dst := r.chunkMem(i)
	switch j, ok := r.byHash[c.known]; {
	case c.known == Hash{}:
		clear(dst)
	case ok:
		copy(dst, r.chunkMem(j))
	case r.opts.Cache != nil && r.opts.Cache.Get(c.known, dst):
	default:
		return false
	}
	r.installed(i)
	return true
}

// chunkMem is chunk i's memory (the last one ends with the region).
func (r *Region) chunkMem(i int) []byte {
	lo := i * r.cs
	return r.mem[lo:min(lo+r.cs, int(r.size))]
}

func (r *Region) installed(i int) {
	c := &r.ch[i]
	c.present = true
	r.local++
	if c.dirtyFrom == 0 {
		r.byHash[c.known] = i
	}
	r.notify()
}

// fetch fetches the claimed chunks from the cluster, at most maxBatch
// bytes per query, and installs them.
func (r *Region) fetch(ctx context.Context, claim []int) error {
	per := max(1, maxBatch/r.cs)
	var firstErr error
	for len(claim) > 0 {
		part := claim[:min(per, len(claim))]
		claim = claim[len(part):]
		if firstErr != nil {
			r.unclaim(part)
			continue
		}
		idx := make([]uint64, len(part))
		for k, i := range part {
			idx[k] = uint64(i)
		}
		r.mu.Lock()
		r.fetchSeq++
		seq := r.fetchSeq
		r.mu.Unlock()
		st, err := r.query(ctx, &pb.RegionQuery{Fetch: idx})
		if err != nil {
			firstErr = err
			r.unclaim(part)
			continue
		}
		r.mu.Lock()
		for k, i := range part {
			c := &r.ch[i]
			r.settle(i)
			if k >= len(st.Data) || c.present || r.mem == nil {
				continue
			}
			var h Hash
			copy(h[:], st.Fetched[k])
			if seq < c.staleBelow || r.auth && c.hasKnown && h != c.known {
				// Fetched before the hashes were read again: stale.
				r.urgent = append(r.urgent, i)
				continue
			}
			dst := r.chunkMem(i)
			clear(dst[copy(dst, st.Data[k]):])
			c.known, c.hasKnown = h, true
			r.pulled += int64(len(st.Data[k]))
			r.installed(i)
			if r.opts.Cache != nil && h != (Hash{}) {
				r.opts.Cache.Put(h, st.Data[k])
			}
		}
		r.notify()
		r.mu.Unlock()
	}
	return firstErr
}

// claim marks chunk i on its way.
func (r *Region) claim(i int) {
	c := &r.ch[i]
	c.fetching = true
	if c.hasKnown && c.known != (Hash{}) {
		r.inflight[c.known]++
	}
}

// settle marks chunk i no longer on its way; guarded by mu.
func (r *Region) settle(i int) {
	c := &r.ch[i]
	if !c.fetching {
		return
	}
	c.fetching = false
	if c.hasKnown && c.known != (Hash{}) {
		if r.inflight[c.known]--; r.inflight[c.known] <= 0 {
			delete(r.inflight, c.known)
		}
	}
}

// sameInFlight: a chunk with i's content is on its way; i is filled from
// it when it comes.
func (r *Region) sameInFlight(i int) bool {
	c := &r.ch[i]
	return c.hasKnown && c.known != (Hash{}) && r.inflight[c.known] > 0
}

func (r *Region) unclaim(part []int) {
	r.mu.Lock()
	for _, i := range part {
		r.settle(i)
	}
	r.notify()
	r.mu.Unlock()
}

func (r *Region) progressLocked() Progress {
	p := Progress{Size: r.size, Pulled: r.pulled, Pushed: r.pushed}
	for i, c := range r.ch {
		n := min(int64(r.cs), r.size-int64(i)*int64(r.cs))
		if c.present {
			p.Local += n
		}
		p.Dirty += spanBytes(c.spans) + spanBytes(c.sending)
		if c.sinceLeech {
			p.DirtySinceLeech += n
		}
	}
	if d := time.Since(r.lastReport).Seconds(); d > 0 {
		p.PullRate = float64(r.pulled-r.lastPulled) / d
		p.PushRate = float64(r.pushed-r.lastPushed) / d
	}
	return p
}

// shutdown stops the background work and moves to state.
func (r *Region) shutdown(state int) {
	r.mu.Lock()
	if r.state != stateHandedOff {
		r.state = state
	}
	r.notify()
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
}

// onRecall: the capability is being taken; nothing is answered under it
// from now on.
func (r *Region) onRecall(inos []uint64) {
	if !slices.Contains(inos, r.ino) {
		return
	}
	r.mu.Lock()
	r.lost = true
	r.notify()
	r.mu.Unlock()
}

// onRelease commits what was written before the capability goes.
func (r *Region) onRelease(inos []uint64) {
	if !slices.Contains(inos, r.ino) {
		return
	}
	r.mu.Lock()
	// Frozen by a Finalize too: its writes were answered and must be
	// committed before the capability goes.
	live := (r.state == stateOpen || r.state == stateFrozen) && r.writable
	target := r.wgen
	r.mu.Unlock()
	if !live {
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
	defer cancel()
	if err := r.waitPushed(ctx, target); err != nil && !errors.Is(err, context.Canceled) {
		slog.Warn("memfs region: write-back before a release failed", "path", r.path, "err", err)
	}
}
