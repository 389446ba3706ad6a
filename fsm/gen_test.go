package fsm_test

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"slices"
	"syscall"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
)

// logGen produces a random but reproducible command log over a small
// namespace, so that commands collide (same names, same files) often.
type logGen struct {
	rng      *rand.Rand
	time     int64
	sessions []uint64 // ids the log may use (some expired)
	handles  []uint64 // ids handed out so far
	grants   []uint64 // epochs of grants so far
	seq      map[uint64]uint64
	reserved map[uint64][]uint64     // session -> first numbers of its reservations
	inos     []uint64                // inode numbers results have named
	excl     map[uint64][]*pb.CapRef // session -> exclusive capabilities granted to it
	scripts  int                     // batches made by script
}

func newLogGen(seed uint64) *logGen {
	return &logGen{
		rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), time: ft.Start,
		seq: map[uint64]uint64{}, reserved: map[uint64][]uint64{}, excl: map[uint64][]*pb.CapRef{},
	}
}

var genNames = []string{"a", "b", "c", "d", "e"}

func (g *logGen) path() string {
	p := ""
	for range 1 + g.rng.IntN(2) + g.rng.IntN(2) {
		p += "/" + genNames[g.rng.IntN(len(genNames))]
	}
	return p
}

func (g *logGen) data() []byte {
	n := g.rng.IntN(3 * cs)
	b := make([]byte, n)
	switch g.rng.IntN(3) {
	case 0: // zeros
	case 1:
		for i := range b {
			b[i] = byte(g.rng.IntN(4)) // few distinct chunks: dedup
		}
	default:
		for i := range b {
			b[i] = byte(g.rng.Uint32())
		}
	}
	return b
}

func (g *logGen) handle() uint64 {
	if len(g.handles) == 0 || g.rng.IntN(10) == 0 {
		return uint64(g.rng.IntN(5))
	}
	return g.handles[g.rng.IntN(len(g.handles))]
}

// command returns a random command (open_session ids are tracked by
// counting, which is how the state machine hands them out).
func (g *logGen) command() *pb.Command {
	var c *pb.Command
	switch g.rng.IntN(33) {
	case 0:
		c = ft.Mkdir(g.path(), uint32(g.rng.IntN(0o1000)))
	case 1, 2:
		flags := []uint32{ft.OCreat | ft.ORdwr, ft.ORdonly, ft.OWronly | ft.OAppend, ft.OCreat | ft.OExcl | ft.OWronly, ft.ORdwr | ft.OTrunc}[g.rng.IntN(5)]
		c = ft.Open(g.path(), flags, 0o644)
		if g.rng.IntN(3) == 0 {
			c = ft.OpenExcl(g.path(), flags, g.rng.IntN(2) == 0)
		}
	case 3:
		c = ft.Close(g.handle())
	case 4, 5:
		c = ft.Write(g.path(), int64(g.rng.IntN(4*cs)), g.data())
	case 6:
		c = g.mixedWrite()
	case 7:
		c = ft.WriteH(g.handle(), int64(g.rng.IntN(4*cs)), g.data())
	case 8:
		c = ft.Remove(g.path())
	case 9:
		c = ft.Rename(g.path(), g.path())
	case 10:
		c = ft.Truncate(g.path(), int64(g.rng.IntN(5*cs)))
	case 11:
		c = ft.Symlink(g.path(), g.path())
	case 12:
		c = ft.Link(g.path(), g.path())
	case 13:
		v := g.data()
		c = ft.SetXattr(g.path(), "user."+genNames[g.rng.IntN(3)], v[:min(len(v), g.rng.IntN(8))], uint32(g.rng.IntN(3)))
	case 14:
		c = ft.RemoveXattr(g.path(), "user."+genNames[g.rng.IntN(3)])
	case 15:
		c = ft.Clone(g.path(), g.path(), g.rng.IntN(2) == 0)
	case 16:
		return ft.OpenSession(int64(1000 + g.rng.IntN(10000))) // sessionless by definition
	case 17:
		c = ft.KeepAlive()
	case 18:
		c = ft.KeepAlive()
		if g.rng.IntN(4) == 0 {
			c = ft.CloseSession()
		}
	case 19:
		c = ft.Chmod(g.path(), uint32(g.rng.IntN(0o10000)))
	case 20:
		c = ft.SetAttr(ft.Path(g.path()), &pb.SetAttrCmd{Valid: uint32(g.rng.IntN(512)), Size: int64(g.rng.IntN(3 * cs)), MtimeNs: g.rng.Int64()})
	case 21:
		inos := make([]uint64, 1+g.rng.IntN(4))
		for i := range inos {
			inos[i] = g.ino()
		}
		c = ft.Grant(g.rng.IntN(2) == 0, inos...)
		c.GetGrant().Exclusive = g.rng.IntN(3) == 0
	case 22:
		epoch := uint64(g.rng.IntN(5))
		if len(g.grants) > 0 && g.rng.IntN(4) != 0 {
			epoch = g.grants[g.rng.IntN(len(g.grants))]
		}
		c = ft.Release(g.ino(), epoch)
	case 23:
		types := []uint32{0o010000, 0o140000, 0o020000, 0o060000, 0, 0o040000}
		c = ft.Mknod(g.path(), types[g.rng.IntN(len(types))]|uint32(g.rng.IntN(0o10000)), uint64(g.rng.IntN(1<<20)))
	case 24:
		c = ft.ReserveInodes(uint32(g.rng.IntN(12)))
	case 25, 26:
		c = ft.Batch(nil) // filled in below, once its session is chosen
	case 27:
		c = ft.Touch(g.ino(), g.ino())
	case 28, 29:
		c = g.lock()
	case 30:
		c = ft.Leech(g.ino(), g.rng.IntN(2) == 0, g.rng.IntN(5) == 0)
	case 31:
		epoch, to := uint64(g.rng.IntN(5)), uint64(g.rng.IntN(4))
		if len(g.grants) > 0 && g.rng.IntN(4) != 0 {
			epoch = g.grants[g.rng.IntN(len(g.grants))]
		}
		if len(g.sessions) > 0 && g.rng.IntN(4) != 0 {
			to = g.sessions[g.rng.IntN(len(g.sessions))]
		}
		c = ft.Handoff(g.ino(), epoch, to)
	default:
		c = ft.Tick()
	}
	if len(g.sessions) > 0 && g.rng.IntN(5) != 0 {
		s := g.sessions[g.rng.IntN(len(g.sessions))]
		c.Session = s
		if g.rng.IntN(4) != 0 {
			g.seq[s]++
			c.Seq = g.seq[s]
			if g.rng.IntN(10) == 0 && c.Seq > 1 {
				c.Seq -= uint64(g.rng.IntN(int(c.Seq))) // a retry
			}
			c.Ack = c.Seq - uint64(g.rng.IntN(int(c.Seq)))
		}
	}
	if b := c.GetBatch(); b != nil {
		g.fillBatch(b, c.Session)
	} else {
		g.pickIno(c, c.Session)
	}
	return c
}

// lock returns a lock command on one of few inodes, owners and ranges, so
// that locks conflict, split, merge, wait and deadlock.
func (g *logGen) lock() *pb.Command {
	ino, owner := g.ino(), uint64(1+g.rng.IntN(3))
	typ := pb.LockType(g.rng.IntN(3))
	switch g.rng.IntN(6) {
	case 0:
		return ft.Flock(ino, owner, typ, g.rng.IntN(2) == 0)
	case 1:
		return ft.CancelLock(ino, g.handle()+uint64(g.rng.IntN(3)))
	}
	start := uint64(g.rng.IntN(8))
	end := start + uint64(g.rng.IntN(8))
	if g.rng.IntN(4) == 0 {
		end = 1<<64 - 1
	}
	return ft.Lock(ino, owner, typ, start, end, g.rng.IntN(2) == 0)
}

// fillBatch makes b a batch of session s: a few commands of the kinds a
// batch takes (now and then one it refuses, or one with a retry identity
// of its own), stamped within the window or not, fenced by capabilities s
// holds exclusively, or by none, or by wrong ones.
func (g *logGen) fillBatch(b *pb.BatchCmd, s uint64) {
	if g.rng.IntN(3) == 0 {
		g.scriptBatch(b, s)
		return
	}
	n := 1 + g.rng.IntN(2)
	if g.rng.IntN(4) == 0 {
		n += g.rng.IntN(4)
	}
	for range n {
		var c *pb.Command
		for {
			seqs := g.seq[s]
			c = g.command()
			g.seq[s] = seqs
			if c.GetBatch() == nil && (g.rng.IntN(40) == 0 || nestable(c)) {
				break
			}
		}
		if g.rng.IntN(40) != 0 {
			c.Session, c.Seq, c.Ack = 0, 0, 0
		}
		switch g.rng.IntN(4) {
		case 0:
		case 1:
			c.StampNs = g.time - int64(g.rng.IntN(70))*1e9
		default:
			c.StampNs = g.time - int64(g.rng.IntN(5000))*1e6
		}
		g.pickIno(c, s)
		b.Commands = append(b.Commands, c)
	}
	if held := g.excl[s]; len(held) > 0 && g.rng.IntN(3) != 0 {
		for range 1 + g.rng.IntN(2) {
			b.Fences = append(b.Fences, held[g.rng.IntN(len(held))])
		}
	}
	if g.rng.IntN(6) == 0 {
		b.Fences = append(b.Fences, ft.Fence(g.ino(), uint64(g.rng.IntN(100))))
	}
}

// scriptBatch makes b a batch that mostly succeeds, as a mount sends
// them: a new directory, a file in it with data, a rename, a chmod, and
// last a random command, which fails often and rolls it all back.
func (g *logGen) scriptBatch(b *pb.BatchCmd, s uint64) {
	g.scripts++
	dir := fmt.Sprintf("/s%d", g.scripts)
	if g.rng.IntN(3) == 0 {
		dir = g.path()
	}
	w := ft.Write(dir+"/f", 0, g.data())
	w.GetWrite().Create = true
	b.Commands = []*pb.Command{
		ft.Mkdir(dir, 0o755),
		ft.Open(dir+"/f", ft.OCreat|ft.ORdwr, 0o644),
		w,
		ft.Rename(dir+"/f", dir+"/g"),
		ft.Chmod(dir+"/g", 0o600),
	}
	for range g.rng.IntN(2) {
		for {
			c := g.command()
			if nestable(c) {
				c.Session, c.Seq, c.Ack = 0, 0, 0
				b.Commands = append(b.Commands, c)
				break
			}
		}
	}
	for _, c := range b.Commands {
		g.pickIno(c, s)
		c.StampNs = g.time - int64(g.rng.IntN(3000))*1e6
	}
	if held := g.excl[s]; len(held) > 0 && g.rng.IntN(2) == 0 {
		b.Fences = append(b.Fences, held[g.rng.IntN(len(held))])
	}
}

// nestable reports whether a batch takes c's operation.
func nestable(c *pb.Command) bool {
	switch c.Op.(type) {
	case *pb.Command_Open, *pb.Command_Close, *pb.Command_Write, *pb.Command_Mkdir,
		*pb.Command_Remove, *pb.Command_Rename, *pb.Command_SetAttr, *pb.Command_Symlink,
		*pb.Command_Mknod, *pb.Command_Link, *pb.Command_SetXattr, *pb.Command_RemoveXattr:
		return true
	}
	return false
}

// ino returns an inode number that may exist: mostly one a result named
// (reservations spread the numbers in use).
func (g *logGen) ino() uint64 {
	if len(g.inos) > 0 && g.rng.IntN(2) == 0 {
		return g.inos[g.rng.IntN(len(g.inos))]
	}
	return 1 + uint64(g.rng.IntN(40))
}

// pickIno makes some creating commands name an inode number: mostly one
// of their session's reservations, sometimes one of another session or
// one in use.
func (g *logGen) pickIno(c *pb.Command, s uint64) {
	switch c.Op.(type) {
	case *pb.Command_Open, *pb.Command_Mkdir, *pb.Command_Mknod, *pb.Command_Symlink:
	default:
		return
	}
	if g.rng.IntN(2) == 0 {
		return
	}
	if g.rng.IntN(8) == 0 && len(g.sessions) > 0 {
		s = g.sessions[g.rng.IntN(len(g.sessions))]
	}
	ino := uint64(1 + g.rng.IntN(60))
	if rs := g.reserved[s]; len(rs) > 0 && g.rng.IntN(8) != 0 {
		ino = rs[g.rng.IntN(len(rs))] + uint64(g.rng.IntN(12))
	}
	ft.WithIno(c, ino)
}

// entry returns the next entry: one to four commands, time moving on by
// up to a second (sometimes more, so that leases run out).
func (g *logGen) entry() *pb.Entry {
	g.time += int64(g.rng.IntN(300)) * 1e6
	if g.rng.IntN(200) == 0 {
		g.time += 5e9
	}
	e := ft.Entry(g.time)
	if len(g.sessions) == 0 {
		e.Commands = append(e.Commands, ft.OpenSession(5000))
	}
	for range 1 + g.rng.IntN(4) {
		e.Commands = append(e.Commands, g.command())
	}
	return e
}

// observe learns live sessions and handles from an entry's results, so
// that later commands name them (and, sometimes, stale ones).
func (g *logGen) observe(e *pb.Entry, res []*pb.Result) {
	for i, c := range e.Commands {
		r := res[i]
		switch c.Op.(type) {
		case *pb.Command_OpenSession:
			g.sessions = append(g.sessions, r.Session)
		case *pb.Command_Open:
			if r.Handle != 0 {
				g.handles = append(g.handles, r.Handle)
			}
		case *pb.Command_Grant:
			if r.Epoch != 0 {
				g.grants = append(g.grants, r.Epoch)
			}
			if c.GetGrant().Exclusive && r.Errno == 0 {
				for _, ino := range r.Granted {
					g.excl[c.Session] = append(g.excl[c.Session], ft.Fence(ino, r.Epoch))
				}
			}
		case *pb.Command_ReserveInodes:
			if r.Errno == 0 {
				g.reserved[c.Session] = append(g.reserved[c.Session], r.FirstIno)
			}
		case *pb.Command_CloseSession:
			if r.Errno == 0 {
				g.sessions = slices.DeleteFunc(g.sessions, func(s uint64) bool { return s == c.Session })
			}
		}
		for i, x := range append([]*pb.Result{r}, r.Results...) {
			if x.Errno == 0 && x.Attr != nil && len(g.inos) < 200 {
				g.inos = append(g.inos, x.Attr.Ino)
			}
			if i > 0 && x.Handle != 0 {
				g.handles = append(g.handles, x.Handle)
			}
		}
		if r.Errno == uint32(syscall.ESTALE) && g.rng.IntN(2) == 0 {
			g.sessions = slices.DeleteFunc(g.sessions, func(s uint64) bool { return s == c.Session })
		}
	}
}

// genLog makes a log of n entries, steered by applying it as it goes.
func genLog(seed uint64, n int) []*pb.Entry {
	g := newLogGen(seed)
	f, err := fsm.New(fsm.Config{ChunkSize: cs, MemoryLimit: genLimit})
	if err != nil {
		panic(err)
	}
	out := make([]*pb.Entry, n)
	for i := range out {
		out[i] = g.entry()
		g.observe(out[i], f.Apply(uint64(i+1), out[i]))
	}
	return out
}

// genLimit is the memory budget of generated logs: small enough that
// some writes hit ENOSPC.
const genLimit = 64 * cs

func (g *logGen) String() string { return fmt.Sprintf("logGen(t=%d)", g.time) }

// mixedWrite is a write with some whole chunks named by hash (dedup on the
// wire) and the rest as data, some whole chunks with their sums; a named
// block may or may not be stored.
func (g *logGen) mixedWrite() *pb.Command {
	off := int64(g.rng.IntN(4 * cs))
	if g.rng.IntN(2) == 0 {
		off -= off % cs
	}
	data := g.data()
	w := &pb.WriteCmd{Loc: ft.Path(g.path()), Offset: off, Length: uint64(len(data))}
	for pos := off; pos < off+int64(len(data)); {
		next := min((pos/cs+1)*cs, off+int64(len(data)))
		piece := data[pos-off : next-off]
		h := sha256.Sum256(piece)
		switch whole := pos%cs == 0 && len(piece) == cs; {
		case whole && g.rng.IntN(3) == 0:
			w.Hashes, w.Sums = append(w.Hashes, h[:]), append(w.Sums, nil)
		case whole && g.rng.IntN(2) == 0: // data with the sum the leader adds
			w.Hashes, w.Sums = append(w.Hashes, nil), append(w.Sums, h[:])
			w.Data = append(w.Data, piece...)
		default:
			w.Hashes, w.Sums = append(w.Hashes, nil), append(w.Sums, nil)
			w.Data = append(w.Data, piece...)
		}
		pos = next
	}
	return &pb.Command{Op: &pb.Command_Write{Write: w}}
}
