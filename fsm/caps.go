package fsm

import (
	"syscall"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Capabilities. A session holding a capability on an inode may cache the
// inode's attributes and data and, for a directory, its whole listing,
// because no command of another session changes the inode while the
// capability is held: every handler that changes inodes first calls guard,
// which refuses the command (Result.recall) and marks the capabilities in
// its way recalled. The node applies the command again once they are
// released or revoked. A recalled capability the holder does not release
// within its session's lease is revoked on log time, so a dead or cut-off
// holder delays others by at most its lease; the holder, knowing the same
// bound, stops trusting its caches before that (docs/protocol.md).
//
// The epoch of a capability is the log index of its grant: a release names
// it, so a holder's late release of an earlier grant never gives up a later
// one. Its tenure (since) is the epoch at which the session's unbroken
// holding of the inode began: granting a capability the session holds
// again changes the epoch but not the tenure, as nobody else could
// change the inode in between. Batch fences are checked against the tenure
// (checkFences), so re-grants never lose what the holder answered before.

// capab is one session's capability on one inode.
type capab struct {
	session uint64
	ino     uint64
	epoch   uint64
	// since <= epoch: the epoch of the grant that began the session's
	// unbroken holding of the inode.
	since uint64
	// revokeAt is the log time at which a recalled capability is taken
	// from its holder; 0 while nobody waits for it.
	revokeAt int64
	// excl: no other session holds one on the inode while this lasts.
	excl bool
	// leecher: the session registered to take an exclusive capability
	// over (LeechCmd), 0 for none; ready: it says it has pulled enough.
	leecher uint64
	ready   bool
	// reported: the handoff that began this tenure listed the chunks its
	// previous holder changed since this session registered as leecher
	// (changed, ascending). Never changed in place: copies share it.
	reported bool
	changed  []uint64
}

// maxGrant bounds the capabilities one GrantCmd may ask for, entries of
// the directories included.
const maxGrant = 1 << 16

// errRecall refuses a command until capabilities in its way are gone.
var errRecall = &Error{Errno: syscall.EAGAIN, Msg: "waiting for capabilities to be recalled"}

func (s *state) capsOf(ino uint64) []*capab {
	var out []*capab
	if s.ncaps == 0 {
		return nil
	}
	it := s.caps.root().Iterator()
	it.SeekPrefix(u64key(ino))
	for {
		_, c, ok := it.Next()
		if !ok {
			return out
		}
		out = append(out, c)
	}
}

func (t *tx) putCap(c *capab) {
	if old, ok := t.caps.get(pairKey(c.ino, c.session)); !ok {
		t.ncaps++
	} else if old.excl {
		t.nexcl--
	}
	if c.excl {
		t.nexcl++
	}
	t.caps.put(pairKey(c.ino, c.session), c)
	if c.revokeAt != 0 && (t.minRevoke == 0 || c.revokeAt < t.minRevoke) {
		t.minRevoke = c.revokeAt
	}
}

func (t *tx) delCap(c *capab) {
	if old, ok := t.caps.get(pairKey(c.ino, c.session)); ok {
		t.ncaps--
		if old.excl {
			t.nexcl--
		}
		t.caps.del(pairKey(c.ino, c.session))
		t.capsGone = true
	}
}

// guard refuses the running command when another session holds a
// capability on any of inos, recalling those capabilities. Every handler
// that changes an inode (its attributes, data or, for a directory, its
// entries) calls it with all of them after validating and before changing
// anything; TestGuardCoversChanges holds the handlers to that.
func (t *tx) guard(inos ...uint64) error {
	if t.ncaps == 0 {
		return nil
	}
	var in []*capab
	for _, ino := range inos {
		for _, c := range t.capsOf(ino) {
			if c.session != t.cmdSession {
				in = append(in, c)
			}
		}
	}
	if len(in) == 0 {
		return nil
	}
	t.recall(in)
	return errRecall
}

// recall asks the holders of caps to give them back, and sets when the
// cluster takes those not given back: the holder's lease from now.
func (t *tx) recall(caps []*capab) {
	for _, c := range caps {
		if cur, ok := t.caps.get(pairKey(c.ino, c.session)); !ok || cur.revokeAt != 0 {
			continue // recalled before (maybe named twice in caps)
		}
		lease := int64(defaultLeaseMs)
		if s := t.session(c.session); s != nil {
			lease = s.leaseMs
		}
		r := *c
		r.revokeAt = leaseEnd(t.now, lease)
		t.putCap(&r)
		t.recalled = append(t.recalled, &r)
		t.announce(&r, false)
	}
}

func (t *tx) announce(c *capab, revoked bool) {
	if t.ev != nil {
		t.ev.recalls = append(t.ev.recalls, &pb.Recall{Session: c.session, Ino: c.ino, Epoch: c.epoch, Revoked: revoked})
	}
}

// capCreated gives the running command's session a capability on n, which
// it just created in dir, when it holds one on dir: a holder that cached
// dir's listing then caches the new entry too without asking for it, as
// CephFS hands out capabilities with a create. It returns the epoch
// (Result.epoch), or 0.
func (t *tx) capCreated(dir, n *inode) uint64 {
	if t.cmdSession == 0 || t.ncaps == 0 {
		return 0
	}
	d, ok := t.caps.get(pairKey(dir.ino, t.cmdSession))
	if !ok {
		return 0
	}
	// Nobody else can hold one on a new inode: it may be exclusive.
	t.putCap(&capab{session: t.cmdSession, ino: n.ino, epoch: t.index, since: t.index, excl: d.excl})
	return t.index
}

// grantCaps gives the session capabilities on x.Inos (and their entries):
// every inode that exists, is linked and has no recall pending. A grant
// that conflicts with another session's capability (either is exclusive)
// recalls it and waits like a change (errRecall). A capability held
// exclusively stays exclusive when granted again, and one granted again
// keeps its tenure.
func (t *tx) grantCaps(x *pb.GrantCmd, sess *session) (*pb.Result, error) {
	if sess == nil {
		return nil, errf(syscall.ESTALE, "grant needs a session")
	}
	want := make([]uint64, 0, len(x.Inos))
	for _, ino := range x.Inos {
		if n := t.inode(ino); n != nil {
			if err := t.checkInside(n); err != nil {
				return nil, err
			}
		}
		want = append(want, ino)
		if !x.WithEntries {
			continue
		}
		if n := t.inode(ino); n != nil && n.isDir() {
			for _, e := range t.entries(ino) {
				want = append(want, e.ino)
				if len(want) > maxGrant {
					break
				}
			}
		}
		if len(want) > maxGrant {
			return nil, errf(syscall.E2BIG, "grant of more than %d capabilities", maxGrant)
		}
	}
	var conflicts []*capab
	for _, ino := range want {
		for _, c := range t.capsOf(ino) {
			if c.session != sess.id && (x.Exclusive || c.excl) {
				conflicts = append(conflicts, c)
			}
		}
	}
	if len(conflicts) > 0 {
		t.recall(conflicts)
		return nil, errRecall
	}
	res := &pb.Result{Epoch: t.index}
	asked := len(x.Inos)
	for i, ino := range want {
		if !t.grantable(ino) {
			if i < asked {
				res.Refused = append(res.Refused, ino)
			}
			continue
		}
		c := &capab{session: sess.id, ino: ino, epoch: t.index, since: t.index, excl: x.Exclusive}
		if old, ok := t.caps.get(pairKey(ino, sess.id)); ok {
			c.since = old.since
			c.excl = c.excl || old.excl
			c.leecher, c.ready = old.leecher, old.ready
		}
		t.putCap(c)
		res.Granted = append(res.Granted, ino)
	}
	return res, nil
}

// grantable reports whether ino may be granted: it exists, has a name
// (an unlinked inode changes no more, but is not worth a capability), no
// other session waits for a recall of it, and no exclusive open waits to
// truncate it (see open).
func (t *tx) grantable(ino uint64) bool {
	n := t.inode(ino)
	if n == nil || n.nlink == 0 || t.truncateQueued(ino) {
		return false
	}
	for _, c := range t.capsOf(ino) {
		if c.revokeAt != 0 {
			return false
		}
	}
	return true
}

// truncateQueued reports whether an exclusive open with O_TRUNC waits in
// line for ino.
func (t *tx) truncateQueued(ino uint64) bool {
	l := t.lock(ino)
	if l == nil {
		return false
	}
	for _, id := range l.queue {
		if h := t.handle(id); h != nil && h.flags&oTrunc != 0 {
			return true
		}
	}
	return false
}

// releaseCaps drops the session's capabilities that x names with their
// current epoch; Result.n counts them.
func (t *tx) releaseCaps(x *pb.ReleaseCmd, sess *session) (*pb.Result, error) {
	if sess == nil {
		return nil, errf(syscall.ESTALE, "release needs a session")
	}
	var n uint64
	for _, ref := range x.Caps {
		if ref == nil {
			continue
		}
		c, ok := t.caps.get(pairKey(ref.Ino, sess.id))
		if ok && c.epoch == ref.Epoch {
			t.delCap(c)
			n++
		}
	}
	return &pb.Result{N: n}, nil
}

// revokeDue takes the recalled capabilities whose holders did not release
// them within their lease. minRevoke keeps the common case to one
// comparison.
func (t *tx) revokeDue() {
	if t.minRevoke == 0 || t.now < t.minRevoke {
		return
	}
	var due []*capab
	var next int64
	t.caps.root().Walk(func(_ []byte, c *capab) bool {
		switch {
		case c.revokeAt == 0:
		case c.revokeAt <= t.now:
			due = append(due, c)
		case next == 0 || c.revokeAt < next:
			next = c.revokeAt
		}
		return false
	})
	t.minRevoke = next
	for _, c := range due {
		t.delCap(c)
		t.announce(c, true)
	}
}

// dropCaps removes every capability of session id (ended) or, with ino
// set, on inode ino (freed).
func (t *tx) dropCaps(session, ino uint64) {
	if t.ncaps == 0 {
		return
	}
	var gone []*capab
	if ino != 0 {
		gone = t.capsOf(ino)
	} else {
		t.caps.root().Walk(func(_ []byte, c *capab) bool {
			if c.session == session {
				gone = append(gone, c)
			}
			return false
		})
	}
	for _, c := range gone {
		t.delCap(c)
	}
}

// CapsReleased returns a channel closed at the next publish of a state in
// which some capability went away (released, revoked, or with its session
// or inode): the moment a command refused for a recall may pass.
func (f *FSM) CapsReleased() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.capsGone
}

// NextRevoke is the log time at which the earliest recalled capability
// is revoked unless released before (0: none is recalled).
func (f *FSM) NextRevoke() int64 { return f.cur.Load().minRevoke }
