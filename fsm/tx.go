package fsm

import (
	"math"
	"slices"
	"syscall"

	"google.golang.org/protobuf/proto"

	pb "github.com/memoryfs/memfs/memfspb"
)

// tx applies one entry: a private copy of the state whose trees are open
// transactions. Handlers validate everything before they change anything,
// so a command that fails leaves no trace.
type tx struct {
	state
	ev        *changes            // nil when nobody watches
	fresh     map[uint64]*inode   // inodes copied in this entry, safe to change in place
	freshSess map[uint64]*session // sessions likewise
	// cmdSession is the session of the command being applied: its own
	// capabilities never stand in its way.
	cmdSession uint64
	capsGone   bool // some capability went away in this entry
	// stamp is the time the running command sets on the inodes it
	// changes: the entry's time, or within a batch the command's own
	// stamp (stampFor). now stays the entry's time, which drives leases
	// and revocations.
	stamp int64
	// blog logs block references while a batch runs (batch.go); nil
	// otherwise.
	blog *blockLog
	// recalled lists the capabilities recalled in this entry, so that a
	// batch rolled back for a recall keeps them recalled.
	recalled []*capab
}

func begin(cur *state, index uint64, timeNs int64, watch bool) *tx {
	t := &tx{state: *cur}
	t.index = index
	// Log time never goes back, even if a new leader's clock is behind.
	t.now = max(t.now, timeNs)
	t.stamp = t.now
	if watch {
		t.ev = &changes{}
	}
	return t
}

// changes collects what an entry changed, for Config.OnChange.
type changes struct {
	inodes  []uint64
	entries []*pb.Dirent
	recalls []*pb.Recall
}

func (t *tx) touch(ino uint64) {
	if t.ev != nil {
		t.ev.inodes = append(t.ev.inodes, ino)
	}
}

func (t *tx) entryChanged(parent uint64, name string) {
	if t.ev != nil {
		t.ev.entries = append(t.ev.entries, &pb.Dirent{Ino: parent, Name: name})
	}
}

// event lists changed inodes in ascending order, each once, and entries
// in the order they changed.
func (c *changes) event(index uint64) *pb.WatchEvent {
	slices.Sort(c.inodes)
	return &pb.WatchEvent{Index: index, Inodes: slices.Compact(c.inodes), Entries: c.entries, Recalls: c.recalls}
}

// orEmpty lets handlers read a missing sub-message as an empty one.
func orEmpty[T any, P interface{ *T }](p P) P {
	if p == nil {
		return new(T)
	}
	return p
}

// command applies one command with its retry identity.
func (t *tx) command(c *pb.Command) *pb.Result {
	if c == nil || c.Op == nil {
		return errResult(errf(syscall.EINVAL, "command without an operation"))
	}
	if op, ok := c.Op.(*pb.Command_OpenSession); ok {
		r, err := t.openSession(orEmpty(op.OpenSession), c.Owner)
		if err != nil {
			return errResult(err)
		}
		return r
	}
	var sess *session
	if c.Session != 0 {
		if sess = t.session(c.Session); sess == nil {
			return errResult(errf(syscall.ESTALE, "session %d is unknown or expired", c.Session))
		}
		if sess.owner != c.Owner {
			// Before the recorded results: another client must not read
			// them by replaying a (session, seq), nor renew the lease.
			return errResult(errf(syscall.EPERM, "session %d belongs to another client", c.Session))
		}
		sess = t.sessMut(sess)
		sess.expires = leaseEnd(t.now, sess.leaseMs)
		if r := sess.recorded(c.Seq); c.Seq != 0 && r != nil {
			return copyResult(r)
		}
		if c.Seq != 0 && c.Seq < sess.floor {
			return errResult(errf(syscall.EALREADY, "command %d of session %d was already answered", c.Seq, sess.id))
		}
		sess.prune(c.Ack)
	}
	t.cmdSession = c.Session
	var r *pb.Result
	var err error
	if c.Root != "" {
		r, err = t.confinedExec(c, sess)
	} else {
		r, err = t.exec(c, sess)
	}
	if err == errRecall {
		// Not recorded either: the node applies it again when the
		// capabilities are gone, under the same (session, seq).
		r = errResult(err)
		r.Recall = true
		return r
	}
	if err != nil {
		r = errResult(err)
	} else if r == nil {
		r = &pb.Result{}
	}
	// EREMOTEIO is not recorded: it asks the sender to send the write
	// again with its data under the same (session, seq), and a recorded
	// refusal would answer that resend. The refused command changed
	// nothing, so forgetting it cannot apply anything twice.
	if sess != nil && c.Seq != 0 && r.Errno != uint32(syscall.EREMOTEIO) {
		if s := t.session(sess.id); s != nil { // gone if the command ended it
			t.sessMut(s).record(c.Seq, copyResult(r))
		}
	}
	return r
}

func (t *tx) exec(c *pb.Command, sess *session) (*pb.Result, error) {
	switch op := c.Op.(type) {
	case *pb.Command_Open:
		return t.open(orEmpty(op.Open), sess)
	case *pb.Command_Close:
		return t.closeCmd(orEmpty(op.Close), sess)
	case *pb.Command_Write:
		return t.write(orEmpty(op.Write), sess)
	case *pb.Command_Mkdir:
		return t.mkdir(orEmpty(op.Mkdir), sess)
	case *pb.Command_Remove:
		return t.remove(orEmpty(op.Remove))
	case *pb.Command_Rename:
		return t.rename(orEmpty(op.Rename))
	case *pb.Command_SetAttr:
		return t.setAttr(orEmpty(op.SetAttr), sess)
	case *pb.Command_Symlink:
		return t.symlink(orEmpty(op.Symlink), sess)
	case *pb.Command_Mknod:
		return t.mknod(orEmpty(op.Mknod), sess)
	case *pb.Command_Link:
		return t.link(orEmpty(op.Link))
	case *pb.Command_SetXattr:
		return t.setXattr(orEmpty(op.SetXattr))
	case *pb.Command_RemoveXattr:
		return t.removeXattr(orEmpty(op.RemoveXattr))
	case *pb.Command_Clone:
		return t.clone(orEmpty(op.Clone))
	case *pb.Command_Grant:
		return t.grantCaps(orEmpty(op.Grant), sess)
	case *pb.Command_Release:
		return t.releaseCaps(orEmpty(op.Release), sess)
	case *pb.Command_ReserveInodes:
		return t.reserveInodes(orEmpty(op.ReserveInodes), sess)
	case *pb.Command_Batch:
		return t.batch(orEmpty(op.Batch), sess)
	case *pb.Command_Touch:
		return t.touchCmd(orEmpty(op.Touch))
	case *pb.Command_Lock:
		return t.lockCmd(orEmpty(op.Lock), sess)
	case *pb.Command_Leech:
		return t.leech(orEmpty(op.Leech), sess)
	case *pb.Command_Handoff:
		return t.handoff(orEmpty(op.Handoff), sess)
	case *pb.Command_KeepAlive:
		if sess == nil {
			return nil, errf(syscall.ESTALE, "keep_alive without a session")
		}
		return &pb.Result{Session: sess.id, LeaseMs: sess.leaseMs}, nil
	case *pb.Command_CloseSession:
		if sess == nil {
			return nil, errf(syscall.ESTALE, "close_session without a session")
		}
		t.endSession(sess.id)
		return &pb.Result{Session: sess.id}, nil
	case *pb.Command_Tick:
		return &pb.Result{}, nil
	case *pb.Command_TokenCreate:
		return t.tokenCreate(orEmpty(op.TokenCreate))
	case *pb.Command_TokenRevoke:
		return t.tokenRevoke(orEmpty(op.TokenRevoke))
	}
	return nil, errf(syscall.EINVAL, "unknown operation %T", c.Op)
}

// copyResult copies the fields a command result can carry, so the
// recorded result never shares memory with the one handed to the caller.
func copyResult(r *pb.Result) *pb.Result {
	c := &pb.Result{
		Errno: r.Errno, Handle: r.Handle, N: r.N, Session: r.Session,
		Queued: r.Queued, Message: r.Message, LeaseMs: r.LeaseMs,
		Epoch: r.Epoch, Refused: slices.Clone(r.Refused), Granted: slices.Clone(r.Granted),
		FirstIno: r.FirstIno, Failed: r.Failed, Waiter: r.Waiter,
	}
	if len(r.Results) > 0 {
		c.Results = make([]*pb.Result, len(r.Results))
		for i, x := range r.Results {
			c.Results[i] = copyResult(x)
		}
	}
	if a := r.Attr; a != nil {
		c.Attr = &pb.Attr{
			Ino: a.Ino, Mode: a.Mode, Nlink: a.Nlink, Uid: a.Uid, Gid: a.Gid, Size: a.Size,
			AtimeNs: a.AtimeNs, MtimeNs: a.MtimeNs, CtimeNs: a.CtimeNs,
			Generation: a.Generation, Blocks: a.Blocks, Rdev: a.Rdev,
		}
		if a.Xattrs != nil {
			c.Attr.Xattrs = proto.Uint32(*a.Xattrs)
		}
	}
	return c
}

// ---------------------------------------------------------------------------
// Sessions.

const (
	defaultLeaseMs = 15_000
	maxLeaseMs     = 24 * 3600 * 1000
)

func (t *tx) openSession(x *pb.OpenSessionCmd, owner string) (*pb.Result, error) {
	lease := x.LeaseMs
	if lease < 0 || lease > maxLeaseMs {
		return nil, errf(syscall.EINVAL, "lease of %d ms", lease)
	}
	if lease == 0 {
		lease = defaultLeaseMs
	}
	if len(x.Client) > maxClientLen {
		return nil, errf(syscall.EINVAL, "client description of %d bytes", len(x.Client))
	}
	if len(owner) > maxClientLen {
		return nil, errf(syscall.EINVAL, "owner of %d bytes", len(owner))
	}
	if owner != "" && t.sessionsOf(owner) >= maxSessionsPerOwner {
		return nil, errf(syscall.EUSERS, "%s holds %d sessions already; close some or let them expire", owner, maxSessionsPerOwner)
	}
	s := &session{id: t.nextSession, leaseMs: lease, expires: leaseEnd(t.now, lease), client: x.Client, owner: owner}
	t.nextSession++
	t.sessions.put(u64key(s.id), s)
	if t.minLease == 0 || s.expires < t.minLease {
		t.minLease = s.expires
	}
	return &pb.Result{Session: s.id, LeaseMs: lease}, nil
}

// maxSessionsPerOwner bounds the sessions one identity holds at once, so
// that an authenticated client cannot grow the replicated state (a session
// keeps up to maxDups results) without bound. Without TLS commands have no
// owner and no bound.
const maxSessionsPerOwner = 1024

// sessionsOf counts owner's sessions (a walk of all sessions: only
// identified clients pay for it, once per session they open).
func (t *tx) sessionsOf(owner string) int {
	n := 0
	t.sessions.root().Walk(func(_ []byte, s *session) bool {
		if s.owner == owner {
			n++
		}
		return false
	})
	return n
}

// leaseEnd is now + ms, saturating instead of overflowing.
func leaseEnd(now, ms int64) int64 {
	d := ms * 1_000_000
	if now > math.MaxInt64-d {
		return math.MaxInt64
	}
	return now + d
}

// sessMut returns a private copy of session s for this entry to change
// (its dups and ranges are its own, so they can change in place), reusing
// the copy made earlier in the entry.
func (t *tx) sessMut(s *session) *session {
	if m := t.freshSess[s.id]; m != nil {
		return m
	}
	m := new(session)
	*m = *s
	m.dups = append(make([]dupRec, 0, len(s.dups)+4), s.dups...)
	m.ranges = slices.Clone(s.ranges)
	t.sessions.put(u64key(m.id), m)
	if t.freshSess == nil {
		t.freshSess = make(map[uint64]*session)
	}
	t.freshSess[m.id] = m
	return m
}

// prune drops the recorded results with seq < ack: the client has them.
func (s *session) prune(ack uint64) {
	s.floor = max(s.floor, ack)
	i := 0
	for i < len(s.dups) && s.dups[i].seq < ack {
		i++
	}
	if i > 0 {
		s.dups = slices.Delete(s.dups, 0, i)
	}
}

// record keeps r as the result of seq.
func (s *session) record(seq uint64, r *pb.Result) {
	i, _ := s.dupIndex(seq)
	s.dups = slices.Insert(s.dups, i, dupRec{seq: seq, r: r})
	if len(s.dups) > maxDups {
		s.dups = slices.Delete(s.dups, 0, len(s.dups)-maxDups)
	}
}

// renewSessions renews the lease of every live session that one of cmds
// belongs to, as applying the command would, but before expireSessions:
// the command reached the leader before the entry's time, and a session
// is ended only by an entry that carries nothing of it.
func (t *tx) renewSessions(cmds []*pb.Command) {
	for _, c := range cmds {
		if c.GetSession() == 0 {
			continue
		}
		if s := t.session(c.Session); s != nil && s.owner == c.Owner {
			t.sessMut(s).expires = leaseEnd(t.now, s.leaseMs)
		}
	}
}

// renewAllSessions renews every session's lease at the entry's time: the
// first entries of a new leader, so that the time without one counts
// against no lease.
func (t *tx) renewAllSessions() {
	var all []*session
	t.sessions.root().Walk(func(_ []byte, s *session) bool {
		all = append(all, s)
		return false
	})
	for _, s := range all {
		t.sessMut(s).expires = leaseEnd(t.now, s.leaseMs)
	}
}

// expireSessions ends every session whose lease ran out by the entry's
// time. minLease keeps the common case (nothing due) to one comparison;
// renewals only push leases later, so it stays a lower bound.
func (t *tx) expireSessions() {
	if t.minLease == 0 || t.now < t.minLease {
		return
	}
	var due []uint64
	var next int64
	t.sessions.root().Walk(func(_ []byte, s *session) bool {
		if s.expires <= t.now {
			due = append(due, s.id)
		} else if next == 0 || s.expires < next {
			next = s.expires
		}
		return false
	})
	t.minLease = next
	for _, id := range due {
		t.endSession(id)
	}
}

// endSession closes the session's handles (passing its exclusive opens on
// and dropping its queued ones), releases its file locks, forgets its
// recorded results and removes it.
func (t *tx) endSession(id uint64) {
	// The session goes first, so closing its handles copies nothing of it.
	t.sessions.del(u64key(id))
	delete(t.freshSess, id)
	var hs []uint64
	t.handles.root().Walk(func(_ []byte, h *handle) bool {
		if h.session == id {
			hs = append(hs, h.id)
		}
		return false
	})
	for _, h := range hs {
		t.closeHandle(h)
	}
	t.dropCaps(id, 0)
	t.dropLeecher(id)
	t.dropLocks(id)
}
