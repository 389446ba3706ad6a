// Package fsmtest builds MemoryFS commands, queries and log entries, and
// drives an fsm.FSM with increasing log indexes and times, for tests in
// any package. Production code must never import it.
package fsmtest

import (
	"testing"
	"time"

	"github.com/memoryfs/memfs/fsm"
	pb "github.com/memoryfs/memfs/memfspb"
	"google.golang.org/protobuf/proto"
)

// Open flags (Linux values), as OpenCmd.flags takes them.
const (
	ORdonly = 0
	OWronly = 1
	ORdwr   = 2
	OCreat  = 0x40
	OExcl   = 0x80
	OTrunc  = 0x200
	OAppend = 0x400
)

// Start is the log time of a new Harness's first entry.
const Start = int64(1_700_000_000_000_000_000)

// Harness applies entries to an FSM, one index and one Step of log time
// per entry.
type Harness struct {
	TB      testing.TB
	F       *fsm.FSM
	Index   uint64 // index of the last entry applied
	Time    int64  // log time of the next entry
	Step    time.Duration
	Session uint64 // stamped on commands by Sess
	seq     uint64
}

// New returns a harness over a new FSM.
func New(tb testing.TB, cfg fsm.Config) *Harness {
	tb.Helper()
	f, err := fsm.New(cfg)
	if err != nil {
		tb.Fatalf("fsm.New: %v", err)
	}
	return &Harness{TB: tb, F: f, Time: Start, Step: time.Millisecond}
}

// Apply applies cmds as one entry.
func (h *Harness) Apply(cmds ...*pb.Command) []*pb.Result {
	h.Index++
	res := h.F.Apply(h.Index, Entry(h.Time, cmds...))
	h.Time += int64(h.Step)
	return res
}

// Do applies one command in its own entry.
func (h *Harness) Do(c *pb.Command) *pb.Result { return h.Apply(c)[0] }

// Must applies one command and fails the test unless it succeeds.
func (h *Harness) Must(c *pb.Command) *pb.Result {
	h.TB.Helper()
	r := h.Do(c)
	if err := fsm.ResultError(r); err != nil {
		h.TB.Fatalf("%v: %v", c, err)
	}
	return r
}

// Q answers a query.
func (h *Harness) Q(q *pb.Query) *pb.Result { return h.F.Query(q) }

// MustQ answers a query and fails the test unless it succeeds.
func (h *Harness) MustQ(q *pb.Query) *pb.Result {
	h.TB.Helper()
	r := h.Q(q)
	if err := fsm.ResultError(r); err != nil {
		h.TB.Fatalf("%v: %v", q, err)
	}
	return r
}

// OpenSession opens a session, makes it the harness's, and returns it.
func (h *Harness) OpenSession(leaseMs int64) uint64 {
	h.TB.Helper()
	r := h.Must(OpenSession(leaseMs))
	h.Session, h.seq = r.Session, 0
	return r.Session
}

// Sess stamps c with the harness's session and its next sequence number,
// acknowledging every earlier one (as a client that got its replies does).
func (h *Harness) Sess(c *pb.Command) *pb.Command {
	h.seq++
	c.Session, c.Seq, c.Ack = h.Session, h.seq, h.seq
	return c
}

// Advance moves log time forward by d.
func (h *Harness) Advance(d time.Duration) { h.Time += int64(d) }

// Entry is a log entry of the current version.
func Entry(timeNs int64, cmds ...*pb.Command) *pb.Entry {
	return &pb.Entry{Version: fsm.EntryVersion, TimeNs: timeNs, Commands: cmds}
}

// Marshal encodes an entry as ApplyBytes takes it.
func Marshal(e *pb.Entry) []byte {
	b, err := proto.Marshal(e)
	if err != nil {
		panic(err) // only for messages that cannot be encoded: a test bug
	}
	return b
}

// Locations.

func Path(p string) *pb.Loc                 { return &pb.Loc{Path: p} }
func Lpath(p string) *pb.Loc                { return &pb.Loc{Path: p, Nofollow: true} }
func At(parent uint64, name string) *pb.Loc { return &pb.Loc{Parent: parent, Name: name} }
func Ino(ino uint64) *pb.Loc                { return &pb.Loc{Ino: ino} }

// Commands.

func Mkdir(p string, mode uint32) *pb.Command {
	return &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: Path(p), Mode: mode}}}
}

func Open(p string, flags, mode uint32) *pb.Command {
	return &pb.Command{Op: &pb.Command_Open{Open: &pb.OpenCmd{Loc: Path(p), Flags: flags, Mode: mode}}}
}

// Create opens p read-write, creating it with mode 0644.
func Create(p string) *pb.Command { return Open(p, OCreat|ORdwr, 0o644) }

// OpenExcl is a MemoryFS exclusive open; wait queues behind a holder.
func OpenExcl(p string, flags uint32, wait bool) *pb.Command {
	return &pb.Command{Op: &pb.Command_Open{Open: &pb.OpenCmd{Loc: Path(p), Flags: flags, Mode: 0o644, Exclusive: true, Wait: wait}}}
}

func Close(handle uint64) *pb.Command {
	return &pb.Command{Op: &pb.Command_Close{Close: &pb.CloseCmd{Handle: handle}}}
}

// Write writes data at off into the file at path p (no handle).
func Write(p string, off int64, data []byte) *pb.Command {
	return &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{Loc: Path(p), Offset: off, Data: data}}}
}

// WriteH writes data at off through a handle.
func WriteH(handle uint64, off int64, data []byte) *pb.Command {
	return &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{Handle: handle, Offset: off, Data: data}}}
}

func Remove(p string) *pb.Command {
	return &pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: Path(p)}}}
}

func Unlink(p string) *pb.Command {
	return &pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: Path(p), FileOnly: true}}}
}

func Rmdir(p string) *pb.Command {
	return &pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: Path(p), DirOnly: true}}}
}

func Rename(src, dst string) *pb.Command {
	return &pb.Command{Op: &pb.Command_Rename{Rename: &pb.RenameCmd{Src: Path(src), Dst: Path(dst)}}}
}

func Symlink(target, p string) *pb.Command {
	return &pb.Command{Op: &pb.Command_Symlink{Symlink: &pb.SymlinkCmd{Loc: Path(p), Target: target}}}
}

func Link(src, dst string) *pb.Command {
	return &pb.Command{Op: &pb.Command_Link{Link: &pb.LinkCmd{Src: Lpath(src), Dst: Path(dst)}}}
}

func SetAttr(loc *pb.Loc, a *pb.SetAttrCmd) *pb.Command {
	a.Loc = loc
	return &pb.Command{Op: &pb.Command_SetAttr{SetAttr: a}}
}

func Truncate(p string, size int64) *pb.Command {
	return SetAttr(Path(p), &pb.SetAttrCmd{Valid: uint32(pb.SetAttrBit_SET_SIZE), Size: size})
}

func Chmod(p string, mode uint32) *pb.Command {
	return SetAttr(Path(p), &pb.SetAttrCmd{Valid: uint32(pb.SetAttrBit_SET_MODE), Mode: mode})
}

func SetXattr(p, name string, value []byte, flags uint32) *pb.Command {
	return &pb.Command{Op: &pb.Command_SetXattr{SetXattr: &pb.SetXattrCmd{Loc: Path(p), Name: name, Value: value, Flags: flags}}}
}

func RemoveXattr(p, name string) *pb.Command {
	return &pb.Command{Op: &pb.Command_RemoveXattr{RemoveXattr: &pb.RemoveXattrCmd{Loc: Path(p), Name: name}}}
}

func Clone(src, dst string, recursive bool) *pb.Command {
	return &pb.Command{Op: &pb.Command_Clone{Clone: &pb.CloneCmd{Src: Path(src), Dst: Path(dst), Recursive: recursive}}}
}

func OpenSession(leaseMs int64) *pb.Command {
	return &pb.Command{Op: &pb.Command_OpenSession{OpenSession: &pb.OpenSessionCmd{LeaseMs: leaseMs}}}
}

func KeepAlive() *pb.Command {
	return &pb.Command{Op: &pb.Command_KeepAlive{KeepAlive: &pb.KeepAliveCmd{}}}
}

func CloseSession() *pb.Command {
	return &pb.Command{Op: &pb.Command_CloseSession{CloseSession: &pb.CloseSessionCmd{}}}
}

// Grant asks for capabilities on inos (and, with entries, their entries).
func Grant(entries bool, inos ...uint64) *pb.Command {
	return &pb.Command{Op: &pb.Command_Grant{Grant: &pb.GrantCmd{Inos: inos, WithEntries: entries}}}
}

// Mknod makes a special file (or a regular one) at p.
func Mknod(p string, mode uint32, rdev uint64) *pb.Command {
	return &pb.Command{Op: &pb.Command_Mknod{Mknod: &pb.MknodCmd{Loc: Path(p), Mode: mode, Rdev: rdev}}}
}

// GrantExcl asks for exclusive capabilities on inos.
func GrantExcl(inos ...uint64) *pb.Command {
	return &pb.Command{Op: &pb.Command_Grant{Grant: &pb.GrantCmd{Inos: inos, Exclusive: true}}}
}

// Release gives back the capability on ino granted at epoch.
func Release(ino, epoch uint64) *pb.Command {
	return &pb.Command{Op: &pb.Command_Release{Release: &pb.ReleaseCmd{Caps: []*pb.CapRef{{Ino: ino, Epoch: epoch}}}}}
}

func Tick() *pb.Command { return &pb.Command{Op: &pb.Command_Tick{Tick: &pb.TickCmd{}}} }

// ReserveInodes reserves count inode numbers for the command's session.
func ReserveInodes(count uint32) *pb.Command {
	return &pb.Command{Op: &pb.Command_ReserveInodes{ReserveInodes: &pb.ReserveInodesCmd{Count: count}}}
}

// WithIno makes the creating command c (open, mkdir, mknod, symlink) take
// the reserved inode number ino.
func WithIno(c *pb.Command, ino uint64) *pb.Command {
	switch op := c.Op.(type) {
	case *pb.Command_Open:
		op.Open.Ino = ino
	case *pb.Command_Mkdir:
		op.Mkdir.Ino = ino
	case *pb.Command_Mknod:
		op.Mknod.Ino = ino
	case *pb.Command_Symlink:
		op.Symlink.Ino = ino
	default:
		panic("fsmtest.WithIno: not a creating command") // a test bug
	}
	return c
}

// Batch applies cmds as one atomic step, fenced by the capabilities in
// fences.
func Batch(fences []*pb.CapRef, cmds ...*pb.Command) *pb.Command {
	return &pb.Command{Op: &pb.Command_Batch{Batch: &pb.BatchCmd{Fences: fences, Commands: cmds}}}
}

// Fence names the capability on ino granted at epoch.
func Fence(ino, epoch uint64) *pb.CapRef { return &pb.CapRef{Ino: ino, Epoch: epoch} }

// Stamped sets when the holder answered c itself (a command in a batch).
func Stamped(c *pb.Command, ns int64) *pb.Command {
	c.StampNs = ns
	return c
}

// Touch waits until no other session holds an exclusive capability on inos.
func Touch(inos ...uint64) *pb.Command {
	return &pb.Command{Op: &pb.Command_Touch{Touch: &pb.TouchCmd{Inos: inos}}}
}

// Leech registers the session as the leecher of another session's
// exclusive capability on ino (ready: it has pulled enough; cancel:
// withdraw).
func Leech(ino uint64, ready, cancel bool) *pb.Command {
	return &pb.Command{Op: &pb.Command_Leech{Leech: &pb.LeechCmd{Ino: ino, Ready: ready, Cancel: cancel}}}
}

// Handoff moves the session's exclusive capability on ino, held at
// epoch, to its leecher to.
func Handoff(ino, epoch, to uint64) *pb.Command {
	return &pb.Command{Op: &pb.Command_Handoff{Handoff: &pb.HandoffCmd{Ino: ino, Epoch: epoch, To: to}}}
}

// Region asks for the region state of ino: the hashes of count chunks
// from first and the data of the chunks in fetch.
func Region(ino, first uint64, count uint32, fetch ...uint64) *pb.Query {
	return &pb.Query{Q: &pb.Query_Region{Region: &pb.RegionQuery{Ino: ino, First: first, Count: count, Fetch: fetch}}}
}

// Lock takes (or with pb.LockType_LOCK_UNLOCK releases) a POSIX record
// lock of owner on bytes [start, end] of ino; wait queues it when held.
func Lock(ino, owner uint64, typ pb.LockType, start, end uint64, wait bool) *pb.Command {
	return &pb.Command{Op: &pb.Command_Lock{Lock: &pb.LockCmd{
		Ino: ino, Owner: owner, Type: typ, Start: start, End: end, Wait: wait, Pid: uint32(owner)}}}
}

// Flock is Lock for a flock(2) lock of the whole file.
func Flock(ino, owner uint64, typ pb.LockType, wait bool) *pb.Command {
	return &pb.Command{Op: &pb.Command_Lock{Lock: &pb.LockCmd{
		Ino: ino, Owner: owner, Type: typ, Flock: true, Wait: wait, Pid: uint32(owner)}}}
}

// CancelLock drops the session's waiter on ino if it still waits.
func CancelLock(ino, waiter uint64) *pb.Command {
	return &pb.Command{Op: &pb.Command_Lock{Lock: &pb.LockCmd{Ino: ino, Cancel: waiter}}}
}

// Queries.

// GetLk asks, as F_GETLK does, which lock stands in the way of one of
// owner of session on [start, end] of ino.
func GetLk(ino, session, owner uint64, typ pb.LockType, start, end uint64) *pb.Query {
	return &pb.Query{Q: &pb.Query_Lock{Lock: &pb.LockQuery{
		Ino: ino, Session: session, Owner: owner, Type: typ, Start: start, End: end}}}
}

// Waiting asks whether a lock waiter of session still waits.
func Waiting(ino, session, waiter uint64) *pb.Query {
	return &pb.Query{Q: &pb.Query_Lock{Lock: &pb.LockQuery{Ino: ino, Session: session, Waiter: waiter}}}
}

func Stat(p string) *pb.Query  { return StatLoc(Path(p)) }
func Lstat(p string) *pb.Query { return StatLoc(Lpath(p)) }

func StatLoc(loc *pb.Loc) *pb.Query {
	return &pb.Query{Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: loc}}}
}

func Read(p string, off, n int64) *pb.Query {
	return &pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{Loc: Path(p), Offset: off, Length: n}}}
}

func ReadH(handle uint64, off, n int64) *pb.Query {
	return &pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{Handle: handle, Offset: off, Length: n}}}
}

func ReadDir(p, cookie string, limit uint32) *pb.Query {
	return &pb.Query{Q: &pb.Query_ReadDir{ReadDir: &pb.ReadDirQuery{Loc: Path(p), Cookie: cookie, Limit: limit}}}
}

func Readlink(p string) *pb.Query {
	return &pb.Query{Q: &pb.Query_Readlink{Readlink: &pb.ReadlinkQuery{Loc: Path(p)}}}
}

func GetXattr(p, name string) *pb.Query {
	return &pb.Query{Q: &pb.Query_GetXattr{GetXattr: &pb.GetXattrQuery{Loc: Path(p), Name: name}}}
}

func ListXattr(p string) *pb.Query {
	return &pb.Query{Q: &pb.Query_ListXattr{ListXattr: &pb.ListXattrQuery{Loc: Path(p)}}}
}

func Statfs() *pb.Query { return &pb.Query{Q: &pb.Query_Statfs{Statfs: &pb.StatfsQuery{}}} }

func HandleStatus(session, handle uint64) *pb.Query {
	return &pb.Query{Q: &pb.Query_Handle{Handle: &pb.HandleQuery{Session: session, Handle: handle}}}
}

func Usage(p string) *pb.Query {
	return &pb.Query{Q: &pb.Query_Usage{Usage: &pb.UsageQuery{Loc: Path(p)}}}
}
