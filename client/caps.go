package client

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"syscall"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Caps is the table of the capabilities a client's session holds (see
// docs/protocol.md, "Capabilities"). While Held reports an inode, no
// command of another session has changed it since the grant: the holder
// may answer for its attributes, data and (a directory) entries from what
// it read under the capability. A command of another session that would
// change it waits until the holder gave it back: the cluster recalls it
// through the change stream, Caps calls the OnRecall functions (which
// drop what was cached) and then releases it.
//
// # When a capability can be trusted
//
// The cluster takes a recalled capability that was not released within
// the session's lease, counted on the leader's clock from the recall. So
// a holder that missed a recall (its change stream is behind or broken, it
// was frozen) must stop trusting its capabilities before that can happen.
// Every command of the session renews its lease at a log index, at a log
// time no earlier than the moment the client sent it; once the change
// stream has delivered that index, every recall committed before it has
// been seen, and any later recall can be enforced no earlier than the send
// time plus the lease. So Caps trusts its capabilities until the send time
// of the latest such command plus the lease, minus a margin for the
// nodes' clocks (trustMargin). The session's keepalive renews every
// lease/4, so an idle client stays trusted while it reaches the cluster.
//
// The assumption: node clocks agree within the margin (NTP) and no clock
// jumps forward by more than that; the client's own clock only measures
// intervals (monotonic).
type Caps struct {
	c *Client

	mu        sync.Mutex
	session   uint64            // the session the capabilities belong to; guarded by mu
	held      map[uint64]uint64 // ino -> epoch; guarded by mu
	excl      map[uint64]uint64 // ino -> epoch of an exclusive grant, while held; guarded by mu
	recalled  map[uint64]uint64 // ino -> epoch recalled while grants are in flight; guarded by mu
	granting  int               // grants in flight; guarded by mu
	pending   []proof           // renewals not yet seen on the stream, by index; guarded by mu
	until     time.Time         // capabilities are trusted before this; guarded by mu
	seen      uint64            // highest index the stream delivered; guarded by mu
	first     uint64            // index of the stream's first event (0: none yet); guarded by mu
	trusted   chan struct{}     // closed when trust is extended; guarded by mu
	onRecall  []func(inos []uint64)
	onRelease []func(inos []uint64)
	onLost    []func(inos []uint64)

	rel chan *pb.CapRef // capabilities to give back
}

// proof is a command that renewed the session: when it was sent, the
// index it was applied at, and when its answer came.
type proof struct {
	sent  time.Time
	index uint64
	at    time.Time
}

// maxPending bounds the renewals waiting to be seen on the stream; older
// ones are dropped (a later one proves more).
const maxPending = 256

// trustMargin is how much earlier than its lease allows a client stops
// trusting its capabilities: the allowance for clocks.
func trustMargin(lease time.Duration) time.Duration { return lease/10 + 100*time.Millisecond }

func newCaps(c *Client) *Caps {
	return &Caps{c: c, held: map[uint64]uint64{}, excl: map[uint64]uint64{}, recalled: map[uint64]uint64{},
		rel: make(chan *pb.CapRef, 4096), trusted: make(chan struct{})}
}

// Caps returns the client's capability table, or nil unless it was made
// WithCaps.
func (c *Client) Caps() *Caps { return c.k.caps }

// OnRecall adds fn to the functions called with the inodes whose
// capabilities are lost (recalled, revoked, or all of them when the change
// stream had to be reopened), before they are released. fn must drop what
// it cached of them and must not block on the cluster. Register before
// the first Grant.
func (cp *Caps) OnRecall(fn func(inos []uint64)) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.onRecall = append(cp.onRecall, fn)
}

// OnLost adds fn to the functions called, instead of the OnRecall ones,
// with the inodes whose capabilities ended with an expired session. It
// runs on the path of the command that met the new session (for a mount,
// inside a request the kernel may hold a directory's lock for): fn must
// drop what was cached at once and must not wait for the kernel or the
// cluster. Register before the first Grant.
func (cp *Caps) OnLost(fn func(inos []uint64)) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.onLost = append(cp.onLost, fn)
}

// OnRelease adds fn to the functions called with the inodes about to be
// released, before the release is sent: fn commits what its holder
// acknowledged under them and has not committed yet (a mount's
// write-behind), so that the command waiting for the release sees it. It
// may block on the cluster. Register before the first Grant.
func (cp *Caps) OnRelease(fn func(inos []uint64)) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.onRelease = append(cp.onRelease, fn)
}

// Held reports whether the session holds a capability on ino that can be
// trusted now.
func (cp *Caps) Held(ino uint64) bool {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	_, ok := cp.held[ino]
	return ok && cp.trustedLocked()
}

// TrustedFor is how much longer the capabilities held can be trusted
// without another renewal seen on the change stream (0: not now). A cache
// must not let anything it answered under them live longer.
func (cp *Caps) TrustedFor() time.Duration {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if !cp.trustedLocked() {
		return 0
	}
	return time.Until(cp.until)
}

// Trusted reports whether the capabilities held can be trusted now.
func (cp *Caps) Trusted() bool {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.trustedLocked()
}

func (cp *Caps) trustedLocked() bool {
	return time.Now().Before(cp.until) && cp.session == cp.c.Session()
}

// Len is how many capabilities the session holds.
func (cp *Caps) Len() int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return len(cp.held)
}

// Grant asks for capabilities on inos and, with entries, on every entry
// of those that are directories; it returns the inodes granted. An inode
// that does not exist, has no name, or is being recalled for another
// session is not granted, and that is not an error.
func (cp *Caps) Grant(ctx context.Context, inos []uint64, entries bool) ([]uint64, error) {
	return cp.grant(ctx, &pb.GrantCmd{Inos: inos, WithEntries: entries})
}

// GrantExclusive asks for exclusive capabilities on inos: while one is
// held, no other session holds any capability on the inode. It waits
// until the cluster has recalled the others' (at most their lease when a
// holder does not answer). It returns the inodes granted.
func (cp *Caps) GrantExclusive(ctx context.Context, inos ...uint64) ([]uint64, error) {
	return cp.grant(ctx, &pb.GrantCmd{Inos: inos, Exclusive: true})
}

// HeldExclusive reports whether the session holds an exclusive capability
// on ino (GrantExclusive) that can be trusted now.
func (cp *Caps) HeldExclusive(ino uint64) bool {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	e, ok := cp.held[ino]
	return ok && cp.excl[ino] == e && cp.trustedLocked()
}

func (cp *Caps) grant(ctx context.Context, g *pb.GrantCmd) ([]uint64, error) {
	defer cp.Expect()()
	cmd := &pb.Command{Op: &pb.Command_Grant{Grant: g}}
	res, err := cp.c.k.apply(ctx, cmd, 0)
	if err != nil {
		return nil, fmt.Errorf("grant: %w", err)
	}
	if e := res.GetErrno(); e != 0 {
		return nil, fmt.Errorf("grant: %s: %w", res.GetMessage(), syscall.Errno(e))
	}
	epoch := res.GetEpoch()
	cp.newSession(cmd.Session)
	var granted, late []uint64
	cp.mu.Lock()
	for _, ino := range res.GetGranted() {
		if cp.recalled[ino] >= epoch || cp.missedLocked(epoch) {
			late = append(late, ino) // recalled, or maybe, before this answer came
			continue
		}
		// A capability held exclusively stays exclusive when granted
		// again, as the cluster keeps it.
		if e, ok := cp.held[ino]; g.Exclusive || ok && cp.excl[ino] == e {
			cp.excl[ino] = epoch
		}
		cp.held[ino] = epoch
		granted = append(granted, ino)
	}
	cp.mu.Unlock()
	for _, ino := range late {
		cp.giveBack(&pb.CapRef{Ino: ino, Epoch: epoch})
	}
	return granted, nil
}

// newSession takes note that capabilities are now granted to session.
// When it is not the session of those held, the old session expired and
// its capabilities went with it, without a recall: what was cached under
// them is dropped (OnRecall) before any capability of the new session is
// held, since other sessions may have changed those inodes meanwhile.
func (cp *Caps) newSession(session uint64) {
	cp.mu.Lock()
	if cp.session == session {
		cp.mu.Unlock()
		return
	}
	lost := slices.Collect(maps.Keys(cp.held))
	cp.session = session
	clear(cp.held)
	clear(cp.excl)
	fns := cp.onLost
	if len(fns) == 0 {
		fns = cp.onRecall
	}
	cp.mu.Unlock()
	if len(lost) > 0 {
		for _, fn := range fns {
			fn(lost)
		}
	}
}

// Expect brackets a command that may hand the session capabilities in its
// result (Result.epoch: a create in a directory the session holds) until
// they are adopted: recalls that arrive meanwhile are remembered, so that
// Adopt never takes one already recalled. Call the function it returns
// after Adopt.
func (cp *Caps) Expect() func() {
	cp.mu.Lock()
	cp.granting++
	cp.mu.Unlock()
	return func() {
		cp.mu.Lock()
		if cp.granting--; cp.granting == 0 {
			clear(cp.recalled)
		}
		cp.mu.Unlock()
	}
}

// Adopt records the capability on ino that a command's result granted at
// epoch (0: none), inside an Expect bracket.
func (cp *Caps) Adopt(ino, epoch uint64) { cp.adopt(ino, epoch, false) }

// adopt is Adopt for a capability that is exclusive when excl (a create
// in a directory held exclusively). An inode held pending (HoldPending)
// that gets none is no longer held.
func (cp *Caps) adopt(ino, epoch uint64, excl bool) {
	cp.mu.Lock()
	if e, ok := cp.held[ino]; ok && e == 0 {
		delete(cp.held, ino)
		delete(cp.excl, ino)
	}
	if epoch == 0 {
		cp.mu.Unlock()
		return
	}
	late := cp.recalled[ino] >= epoch || cp.missedLocked(epoch) || cp.session != cp.c.Session()
	if !late {
		cp.held[ino] = epoch
		if excl {
			cp.excl[ino] = epoch
		}
	}
	cp.mu.Unlock()
	if late {
		cp.giveBack(&pb.CapRef{Ino: ino, Epoch: epoch})
	}
}

// HoldPending records an inode this client made under an exclusive
// capability with an operation not yet committed: nobody else can know of
// it, so it is held exclusively (epoch 0) until the commit hands the real
// capability over (or the operation is lost, DropPending).
func (cp *Caps) HoldPending(ino uint64) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if _, ok := cp.held[ino]; !ok {
		cp.held[ino] = 0
		cp.excl[ino] = 0
	}
}

// DropPending forgets inodes held pending whose creation was lost.
func (cp *Caps) DropPending(inos ...uint64) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for _, ino := range inos {
		if e, ok := cp.held[ino]; ok && e == 0 {
			delete(cp.held, ino)
			delete(cp.excl, ino)
		}
	}
}

// ExclusiveEpoch is the epoch of the exclusive capability held on ino
// (0 for one held pending); ok is false when none can be trusted now.
func (cp *Caps) ExclusiveEpoch(ino uint64) (epoch uint64, ok bool) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	e, held := cp.held[ino]
	if !held || cp.excl[ino] != e || !cp.trustedLocked() {
		return 0, false
	}
	return e, true
}

// missedLocked reports whether recalls of a capability granted at epoch
// may have gone unseen: the change stream was opened again after the
// grant was applied, so it began past recalls in between. (While the new
// stream has delivered nothing yet, its first event drops such grants.)
func (cp *Caps) missedLocked(epoch uint64) bool { return cp.first != 0 && epoch < cp.first }

// Release gives back the capabilities on inos, for a holder that no
// longer caches them.
func (cp *Caps) Release(inos ...uint64) {
	var refs []*pb.CapRef
	cp.mu.Lock()
	for _, ino := range inos {
		if e, ok := cp.held[ino]; ok && e != 0 {
			delete(cp.held, ino)
			delete(cp.excl, ino)
			refs = append(refs, &pb.CapRef{Ino: ino, Epoch: e})
		}
	}
	cp.mu.Unlock()
	for _, r := range refs {
		cp.giveBack(r)
	}
}

// answered records that a command sent at sent was applied at index
// (core.answered). A command of an earlier session proves as much: what
// it proves is that recalls committed after it cannot be enforced before
// sent plus the lease, whichever session they are for.
func (cp *Caps) answered(sent time.Time, index uint64) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	switch {
	case cp.missedLocked(index):
		return // before the stream: recalls before it were not seen
	case cp.first != 0 && index <= cp.seen:
		cp.prove(sent)
		return
	}
	i, _ := slices.BinarySearchFunc(cp.pending, index, func(p proof, idx uint64) int {
		return int64cmp(p.index, idx)
	})
	cp.pending = slices.Insert(cp.pending, i, proof{sent: sent, index: index, at: time.Now()})
	if len(cp.pending) > maxPending {
		cp.pending = cp.pending[1:]
	}
}

func int64cmp(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// prove extends the trust to what a renewal sent at sent allows.
func (cp *Caps) prove(sent time.Time) {
	lease := cp.c.k.sess.Load().lease
	if u := sent.Add(lease - trustMargin(lease)); u.After(cp.until) {
		cp.until = u
		close(cp.trusted)
		cp.trusted = make(chan struct{})
	}
}

// WaitTrusted waits at most d for the capabilities to be trusted (right
// after a client starts, or after its change stream was reopened, until
// a renewal has been seen on the stream) and reports whether they are.
func (cp *Caps) WaitTrusted(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		cp.mu.Lock()
		ok, ch := cp.trustedLocked(), cp.trusted
		cp.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// staleAfter is how long the change stream may leave an answered
// command's index undelivered before Caps takes it for stuck and opens
// another. A stream can go quiet without breaking: its node was cut off
// and is behind, or the connection died without a reset. Its holder would
// miss recalls, and the writers waiting for them would wait for the
// cluster to revoke, a whole lease.
func staleAfter(lease time.Duration) time.Duration { return max(2*time.Second, lease/5) }

// run follows the change stream until ctx ends, and gives capabilities
// back.
func (cp *Caps) run(ctx context.Context) {
	go cp.releaser(ctx)
	reopened := false
	for ctx.Err() == nil {
		sctx, cancel := context.WithCancel(ctx)
		ch, err := cp.c.Watch(sctx)
		if err != nil {
			cancel()
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		if reopened {
			cp.observe(&pb.WatchEvent{})
		}
		cp.follow(ch, cancel)
		cancel()
		reopened = true
	}
}

// follow takes the events of one stream until it ends, and ends it
// (cancel) once it falls staleAfter behind the answers.
func (cp *Caps) follow(ch <-chan *pb.WatchEvent, cancel context.CancelFunc) {
	lag := staleAfter(cp.c.k.sess.Load().lease)
	tick := time.NewTicker(lag / 4)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return
			}
			cp.observe(ev)
		case <-tick.C:
			if behind := cp.behind(); behind > lag {
				cp.c.k.cfg.log.Warn("memfs: change stream is behind the cluster; reopening it", "behind", behind)
				cancel()
				for range ch {
					// Drain: the stream's goroutine ends when it can deliver.
				}
				return
			}
		}
	}
}

// behind is how long ago the oldest answer the stream has not delivered
// came (0: none).
func (cp *Caps) behind() time.Duration {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var d time.Duration
	for _, p := range cp.pending {
		if p.index > cp.seen {
			d = max(d, time.Since(p.at))
		}
	}
	return d
}

// observe takes one change event: the index it reached proves renewals,
// and recalls of this session's capabilities drop them.
func (cp *Caps) observe(ev *pb.WatchEvent) {
	var lost []uint64
	var refs []*pb.CapRef
	cp.mu.Lock()
	if ev.GetIndex() == 0 {
		// The stream was reopened: recalls may have been missed.
		lost = slices.Collect(maps.Keys(cp.held))
		for ino, e := range cp.held {
			refs = append(refs, &pb.CapRef{Ino: ino, Epoch: e})
		}
		clear(cp.held)
		clear(cp.excl)
		cp.until, cp.first, cp.pending = time.Time{}, 0, nil
	} else {
		if cp.first == 0 {
			// The stream's first event: recalls of capabilities granted
			// before it, and renewals before it, prove nothing.
			cp.first = ev.GetIndex()
			for ino, e := range cp.held {
				if e < cp.first {
					delete(cp.held, ino)
					delete(cp.excl, ino)
					lost = append(lost, ino)
					refs = append(refs, &pb.CapRef{Ino: ino, Epoch: e})
				}
			}
			cp.pending = slices.DeleteFunc(cp.pending, func(p proof) bool { return p.index < cp.first })
		}
		cp.seen = max(cp.seen, ev.GetIndex())
		n := 0
		for n < len(cp.pending) && cp.pending[n].index <= cp.seen {
			cp.prove(cp.pending[n].sent)
			n++
		}
		cp.pending = cp.pending[n:]
	}
	for _, r := range ev.GetRecalls() {
		// A grant in flight may be the first of a new session, which
		// cp.session names only once its answer comes: a recall naming
		// the client's session then is remembered for it all the same.
		own := r.GetSession() == cp.session
		if !own && (r.GetSession() != cp.c.Session() || cp.granting == 0) {
			continue
		}
		if cp.granting > 0 {
			cp.recalled[r.GetIno()] = max(cp.recalled[r.GetIno()], r.GetEpoch())
		}
		if !own {
			continue // nothing is held under that session yet
		}
		if e, ok := cp.held[r.GetIno()]; ok && e <= r.GetEpoch() {
			delete(cp.held, r.GetIno())
			delete(cp.excl, r.GetIno())
			lost = append(lost, r.GetIno())
			if !r.GetRevoked() {
				refs = append(refs, &pb.CapRef{Ino: r.GetIno(), Epoch: r.GetEpoch()})
			}
		}
	}
	fns := cp.onRecall
	cp.mu.Unlock()
	if len(lost) > 0 {
		for _, fn := range fns {
			fn(lost)
		}
	}
	for _, r := range refs {
		cp.giveBack(r)
	}
}

func (cp *Caps) giveBack(r *pb.CapRef) {
	select {
	case cp.rel <- r:
	default:
		// Full: the cluster revokes what is not given back after the
		// lease, so a dropped release only delays another session.
		cp.c.k.cfg.log.Warn("memfs: capability release queue full", "ino", r.Ino)
	}
}

// releaser sends the queued releases, as many as are queued in one
// command.
func (cp *Caps) releaser(ctx context.Context) {
	for {
		var refs []*pb.CapRef
		select {
		case <-ctx.Done():
			return
		case r := <-cp.rel:
			refs = append(refs, r)
		}
	more:
		for len(refs) < 4096 {
			select {
			case r := <-cp.rel:
				refs = append(refs, r)
			default:
				break more
			}
		}
		actx, cancel := context.WithTimeout(ctx, cp.c.k.sess.Load().lease)
		cmd := &pb.Command{Op: &pb.Command_Release{Release: &pb.ReleaseCmd{Caps: refs}}}
		// Operations answered under these capabilities go first, and none
		// is admitted meanwhile (Journal.Admit): settleCommand syncs them.
		j := cp.c.k.journal.Load()
		if j != nil {
			j.admit.Lock()
		}
		cp.mu.Lock()
		fns := cp.onRelease
		cp.mu.Unlock()
		if len(fns) > 0 {
			inos := make([]uint64, len(refs))
			for i, r := range refs {
				inos[i] = r.Ino
			}
			for _, fn := range fns {
				fn(inos)
			}
		}
		if _, err := cp.c.k.apply(actx, cmd, 0); err != nil && ctx.Err() == nil {
			cp.c.k.cfg.log.Warn("memfs: releasing capabilities failed", "n", len(refs), "err", err)
		}
		if j != nil {
			j.admit.Unlock()
		}
		cancel()
	}
}

// AdoptHandoff records the exclusive capability on ino that another
// session handed to session at epoch (HandoffCmd), inside an Expect
// bracket opened before the handoff could have been applied, and reports
// whether it is held now. It is not when session is no longer the
// client's, or the capability was recalled or may have been meanwhile.
func (cp *Caps) AdoptHandoff(session, ino, epoch uint64) bool {
	if session == 0 || session != cp.c.Session() {
		return false
	}
	cp.newSession(session)
	cp.adopt(ino, epoch, true)
	cp.mu.Lock()
	defer cp.mu.Unlock()
	e, ok := cp.held[ino]
	return ok && e == epoch && cp.excl[ino] == epoch
}
