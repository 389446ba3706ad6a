package region

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"time"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
)

// pollWait bounds one long poll of the region state.
const pollWait = 5 * time.Second

// holderGoneAfter is how long a leecher sees no holder before it takes
// the capability itself: a holder whose capability another session's
// read or write recalled takes it back at its next write, within
// milliseconds; a dead holder's stays gone.
const holderGoneAfter = 500 * time.Millisecond

// poll long-polls the region state until it differs from last.
func (r *Region) poll(ctx context.Context, last *pb.RegionState) (*pb.RegionState, error) {
	return r.pollFor(ctx, last, pollWait)
}

// pollFor is poll for at most wait.
func (r *Region) pollFor(ctx context.Context, last *pb.RegionState, wait time.Duration) (*pb.RegionState, error) {
	return r.pollQuery(ctx, last, wait, false)
}

// pollChanged is pollFor whose answer carries the chunks the handoff
// that began the holder's tenure reported changed.
func (r *Region) pollChanged(ctx context.Context, last *pb.RegionState, wait time.Duration) (*pb.RegionState, error) {
	return r.pollQuery(ctx, last, wait, true)
}

func (r *Region) pollQuery(ctx context.Context, last *pb.RegionState, wait time.Duration, changed bool) (*pb.RegionState, error) {
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	st, err := r.query(pctx, &pb.RegionQuery{Wait: true, Holder: last.GetHolder(), Epoch: last.GetEpoch(),
		Leecher: last.GetLeecher(), Ready: last.GetReady(), Changed: changed})
	if err != nil && ctx.Err() == nil && (errors.Is(err, client.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)) {
		return last, nil // the poll ran out: ask again
	}
	return st, err
}

// watchLeecher follows the region's leecher, so that the chunks written
// since one registered are known (DirtySinceLeech, Finalize).
func (r *Region) watchLeecher() {
	defer r.wg.Done()
	var last *pb.RegionState
	var lastSent time.Time // when the poll that answered last was sent
	for r.ctx.Err() == nil {
		sent := time.Now()
		st, err := r.poll(r.ctx, last)
		if err != nil {
			select {
			case <-time.After(100 * time.Millisecond):
			case <-r.ctx.Done():
			}
			continue
		}
		if st == nil || st == last {
			continue // the poll ran out
		}
		r.mu.Lock()
		if st.Leecher != r.leecher {
			r.leecher = st.Leecher
			r.sawLeecher(st.Leecher != 0, last != nil, lastSent)
		}
		r.mu.Unlock()
		last, lastSent = st, sent
	}
}

// sawLeecher marks the chunks changed in the cluster since a new leecher
// registered, or to be: those dirty or on their way now, and those whose
// push was committed after since, when the answer of the poll sent at
// since did not show the leecher yet (known). The polls are
// linearizable reads, so a push acknowledged before since was committed
// before that answer's state, and so before the registration; the
// leecher pulled every chunk after it registered.
func (r *Region) sawLeecher(leecher, known bool, since time.Time) {
	for i := range r.ch {
		c := &r.ch[i]
		c.sinceLeech = leecher && (c.dirtyFrom != 0 || c.pushing ||
			!c.ackAt.IsZero() && (!known || !c.ackAt.Before(since)))
	}
}

// WaitLeecher returns the session of a leecher that says it is ready
// (ready false: any leecher), once there is one.
func (r *Region) WaitLeecher(ctx context.Context, ready bool) (uint64, error) {
	var last *pb.RegionState
	for {
		st, err := r.poll(ctx, last)
		if err != nil {
			return 0, err
		}
		if st != nil && st.Leecher != 0 && (st.Ready || !ready) {
			return st.Leecher, nil
		}
		if st == last {
			continue
		}
		last = st
	}
}

// HandoffStats describe one Finalize.
type HandoffStats struct {
	To              uint64        // the session the capability went to
	Epoch           uint64        // its epoch there
	Pushed          int64         // bytes written back during the finalize, in the handoff or before it
	Final           int64         // of them, bytes carried by the handoff command itself
	DirtySinceLeech int64         // bytes written since the leecher registered
	Took            time.Duration // from the freeze to the handoff committed
}

// Finalize hands the region to its registered leecher: it stops taking
// reads and writes (they wait, then fail with ErrHandedOff) and moves the
// capability to the leecher's session in one command that carries the
// ranges written and not yet committed (also those of pushes in flight,
// which the handoff overtakes or fences off). When there is no leecher,
// or it is gone, the region keeps its capability and goes on.
func (r *Region) Finalize(ctx context.Context) (HandoffStats, error) {
	var hs HandoffStats
	if r.opts.ReadOnly {
		return hs, fmt.Errorf("region: read-only: %w", syscall.EBADF)
	}
	start := time.Now()
	r.mu.Lock()
	if r.state != stateOpen {
		r.mu.Unlock()
		return hs, ErrClosed
	}
	r.state = stateFrozen
	pushed0 := r.pushed
	leecher := r.leecher
	hs.DirtySinceLeech = r.progressLocked().DirtySinceLeech
	r.notify()
	r.mu.Unlock()
	resume := func(err error) (HandoffStats, error) {
		r.mu.Lock()
		r.state = stateOpen
		r.notify()
		r.mu.Unlock()
		return hs, err
	}
	r.scanView()
	epoch, ok := r.c.Caps().ExclusiveEpoch(r.ino)
	writes, final, fits := r.finalWrites(epoch)
	if !fits {
		// Too much for one command, or written under another tenure:
		// committed first, the old way.
		if err := r.Sync(ctx); err != nil {
			return resume(err)
		}
		writes, final = nil, 0
	}
	r.mu.Lock()
	lost := r.lost
	r.mu.Unlock()
	if !ok || lost {
		return resume(fmt.Errorf("region %s: capability not held: %w", r.path, syscall.EKEYREVOKED))
	}
	for try := 0; ; try++ {
		if leecher == 0 || try > 0 {
			// The watch has not seen one, or saw one that went: ask.
			st, err := r.query(ctx, &pb.RegionQuery{})
			if err != nil {
				return resume(err)
			}
			if st.Leecher == 0 {
				return resume(fmt.Errorf("region %s: no leecher: %w", r.path, fs.ErrNotExist))
			}
			if try > 0 && st.Leecher == leecher {
				return resume(fmt.Errorf("region %s: handoff to %d: %w", r.path, leecher, fs.ErrNotExist))
			}
			leecher = st.Leecher
		}
		changed, report := r.changedSinceLeech(leecher)
		res, err := r.c.Do(ctx, &pb.Command{Op: &pb.Command_Handoff{Handoff: &pb.HandoffCmd{
			Ino: r.ino, Epoch: epoch, To: leecher, Writes: writes, Changed: changed, Report: report}}})
		if client.Errno(err) == syscall.ENOENT && try == 0 {
			continue
		}
		if err != nil {
			return resume(fmt.Errorf("region %s: handoff: %w", r.path, err))
		}
		hs.Epoch = res.GetEpoch()
		break
	}
	hs.To, hs.Took, hs.Final = leecher, time.Since(start), final
	r.mu.Lock()
	hs.Pushed = r.pushed - pushed0 + final
	r.state = stateHandedOff
	for i := range r.ch {
		c := &r.ch[i]
		c.dirtyFrom, c.spans = 0, nil
	}
	r.notify()
	r.mu.Unlock()
	r.shutdown(stateHandedOff)
	// Forget it here; the release names an epoch the cluster no longer
	// has, and changes nothing.
	r.c.Caps().Release(r.ino)
	r.freeMem()
	return hs, nil
}

// maxReport bounds the chunks a handoff reports changed (the state
// machine takes 65,536); a holder that changed more lets the leecher
// compare hashes.
const maxReport = 1 << 16

// changedSinceLeech lists the chunks changed since leecher registered,
// when the watch has followed that registration (report).
func (r *Region) changedSinceLeech(leecher uint64) (changed []uint64, report bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if leecher == 0 || leecher != r.leecher {
		return nil, false
	}
	for i := range r.ch {
		if r.ch[i].sinceLeech {
			if len(changed) == maxReport {
				return nil, false
			}
			changed = append(changed, uint64(i))
		}
	}
	return changed, true
}

// finalWrites are the writes a handoff under epoch carries: every range
// written and not known committed, the ranges of pushes in flight
// included, with what the memory holds now (the region is frozen). fits
// is false when they would not fit one command, or when a chunk was
// written under an epoch other than the one the handoff names.
func (r *Region) finalWrites(epoch uint64) (ws []*pb.WriteCmd, n int64, fits bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.ch {
		c := &r.ch[i]
		if c.dirtyFrom == 0 && !c.pushing {
			continue
		}
		if c.epoch != epoch {
			return nil, 0, false
		}
		ss := mergeSpans(c.sending, c.spans)
		n += spanBytes(ss)
		for _, w := range r.rangeWrites(i, r.chunkMem(i), ss) {
			w.Data = append([]byte(nil), w.Data...)
			ws = append(ws, w)
		}
		if n > maxBatch || len(ws) > maxPushWrites {
			return nil, 0, false
		}
	}
	return ws, n, true
}

// Leecher pulls a region another session holds, to take it over.
type Leecher struct {
	r       *Region
	expect  func()
	session uint64
	ready   bool
	// holderEpoch is the epoch of the capability first registered on;
	// broken: a registration since found another grant (or none), so
	// the holder's report of what changed may miss changes.
	holderEpoch uint64
	broken      bool
	taken       TakeStats
}

// TakeStats describe how a Take learnt what changed since the pull.
type TakeStats struct {
	Reported bool      // the handoff listed the changed chunks (else every hash was read again)
	Changed  int       // chunks dropped to be fetched again
	Seen     time.Time // when the answer that gave this session the region came
	Trusted  time.Time // when the capability could be trusted
	Ready    time.Time // when Take returned the region
}

// Leech registers c's session as the leecher of path's region and pulls
// its committed chunks in the background while the holder goes on
// writing. c must be made WithCaps. Take ends it.
func Leech(ctx context.Context, c *client.Client, path string, opts Options) (*Leecher, error) {
	opts.defaults()
	opts.ReadOnly, opts.Create, opts.Size = false, false, 0
	caps := c.Caps()
	if caps == nil {
		return nil, errors.New("region: a leecher needs a client made WithCaps")
	}
	// Not a Stat: a linearizable read would recall the holder's capability.
	res, err := c.Query(ctx, &pb.Query{Q: &pb.Query_Region{Region: &pb.RegionQuery{Loc: &pb.Loc{Path: path}}}})
	if err != nil {
		return nil, fmt.Errorf("region %s: %w", path, err)
	}
	ino := res.GetRegion().GetIno()
	r := newRegion(c, path, ino, opts)
	// Recalls of the capability to come are remembered from now on.
	l := &Leecher{r: r, expect: caps.Expect()}
	if err := l.register(ctx); err != nil {
		l.expect()
		return nil, fmt.Errorf("region %s: leech: %w", path, err)
	}
	l.session = c.Session()
	if err := r.load(ctx); err != nil {
		l.Cancel()
		return nil, err
	}
	r.state = stateFrozen // nothing is answered before Take
	r.startPull()
	return l, nil
}

// register makes the session the holder's leecher (ready as l.ready).
// A holder whose capability a read or write of another session recalled
// has none for a moment, and takes it back at its next write: ENOENT is
// final only after holderGoneAfter.
func (l *Leecher) register(ctx context.Context) error {
	deadline := time.Now().Add(holderGoneAfter)
	backoff := time.Millisecond
	for {
		res, err := l.r.c.Do(ctx, &pb.Command{Op: &pb.Command_Leech{Leech: &pb.LeechCmd{Ino: l.r.ino, Ready: l.ready}}})
		if err == nil {
			if l.holderEpoch == 0 {
				l.holderEpoch = res.GetEpoch()
			} else if res.GetEpoch() != l.holderEpoch {
				l.broken = true
			}
		}
		if client.Errno(err) != syscall.ENOENT || time.Now().After(deadline) {
			return err
		}
		if l.holderEpoch != 0 {
			l.broken = true // the registration went with the holder's capability
		}
		select {
		case <-time.After(backoff):
			backoff = min(2*backoff, 20*time.Millisecond)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Progress reports the pull.
func (l *Leecher) Progress() Progress { return l.r.Progress() }

// Taken describes the Take that returned.
func (l *Leecher) Taken() TakeStats { return l.taken }

// Ready tells the holder the leecher has pulled enough (WaitLeecher).
func (l *Leecher) Ready(ctx context.Context) error {
	l.ready = true
	return l.register(ctx)
}

// Cancel withdraws the registration and drops what was pulled.
func (l *Leecher) Cancel() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = l.r.c.Do(ctx, &pb.Command{Op: &pb.Command_Leech{Leech: &pb.LeechCmd{Ino: l.r.ino, Cancel: true}}})
	l.expect()
	l.r.shutdown(stateClosed)
	l.r.freeMem()
}

// Take waits until the holder hands the capability over (Finalize), or
// until the holder is gone (its session ended: the capability is then
// granted here, on what the holder last committed), fetches again only
// the chunks that changed since they were pulled, and returns the
// region, now this session's.
func (l *Leecher) Take(ctx context.Context) (*Region, error) {
	r := l.r
	caps := r.c.Caps()
	var last *pb.RegionState
	var noHolder time.Time     // since when no session holds the file
	var report *pb.RegionState // the answer that showed the handoff, with its list
	var seen time.Time
	for {
		wait := pollWait
		if !noHolder.IsZero() {
			wait = max(time.Until(noHolder.Add(holderGoneAfter)), time.Millisecond)
		}
		st, err := r.pollChanged(ctx, last, wait)
		if err != nil {
			return nil, err
		}
		if st == nil {
			continue // the first poll ran out
		}
		last, seen = st, time.Now()
		if st.Holder != 0 {
			noHolder = time.Time{}
		} else if noHolder.IsZero() {
			noHolder = time.Now()
		}
		switch {
		case st.Holder == l.session && caps.AdoptHandoff(l.session, r.ino, st.Epoch):
			report = st
		case st.Holder == l.session:
			// Handed over, and recalled by another session's read or
			// write before it was adopted (the client gave it back):
			// the handoff is done, and the capability is taken again
			// like after any recall.
			if err := r.grant(ctx); err != nil {
				return nil, err
			}
		case st.Holder == 0 && time.Since(noHolder) < holderGoneAfter:
			continue // recalled, maybe: the holder may take it back
		case st.Holder == 0:
			// The holder is gone: what it committed is the region.
			if err := r.grant(ctx); err != nil {
				return nil, err
			}
		case st.Leecher != l.session:
			// Withdrawn (the holder's capability was granted again
			// after a loss): register again.
			l.broken = true
			if err := l.register(ctx); err != nil && client.Errno(err) != syscall.ENOENT {
				return nil, err
			}
			continue
		default:
			continue
		}
		break
	}
	l.expect()
	if !caps.WaitTrusted(ctx, time.Minute) {
		return nil, fmt.Errorf("region %s: capability not trusted: %w", r.path, syscall.ETIMEDOUT)
	}
	trusted := time.Now()
	epoch, ok := caps.ExclusiveEpoch(r.ino)
	if !ok {
		return nil, fmt.Errorf("region %s: capability lost at once: %w", r.path, syscall.EAGAIN)
	}
	if report != nil && report.Reported && !l.broken && report.Epoch == epoch {
		// The holder listed what changed since the registration, which
		// came before every pull: only those are fetched again.
		r.revalidateChunks(report.Changed)
		l.taken = TakeStats{Reported: true, Changed: len(report.Changed)}
	} else {
		n, err := r.revalidateCount(ctx)
		if err != nil {
			return nil, err
		}
		l.taken = TakeStats{Changed: n}
	}
	r.mu.Lock()
	r.epoch, r.lost, r.writable, r.state = epoch, false, true, stateOpen
	r.notify()
	r.mu.Unlock()
	r.startWriter()
	l.taken.Seen, l.taken.Trusted, l.taken.Ready = seen, trusted, time.Now()
	return r, nil
}
