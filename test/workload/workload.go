// Package workload drives concurrent MemoryFS clients through random file
// system operations and records every invocation and response in a
// model.Recorder, for the linearizability checker.
//
// The keys are fixed so that the model can check each on its own: data
// files /d/f0, /d/f1... (positional writes, appends, reads, size) that are
// never renamed or removed, and namespace groups /n/g0, /n/g1... in which
// names are created, made directories, removed, renamed, listed, stat'ed and
// chmod'ed (see package model).
//
// It never injects faults itself (that is the nemesis's job) and never
// decides whether a history is correct (that is the model's).
package workload

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/test/model"
)

// Config sizes a workload.
type Config struct {
	DataFiles int // keys /d/f0...
	Groups    int // keys /n/g0...
	// DataShare is the fraction of operations on data files (the rest go to
	// namespace groups); 0.5 when 0 and both kinds exist.
	DataShare float64
	// OpTimeout bounds one operation; one that runs out is recorded with an
	// unknown outcome.
	OpTimeout time.Duration
	// MaxOps stops a worker after this many operations (0: until ctx ends).
	MaxOps int
	// Pause is an upper bound of a random think time between operations.
	Pause time.Duration
	Seed  int64
	// Prefix is a directory under which the keys live ("" for the root),
	// so that several histories can run one after another on one cluster,
	// each from empty keys.
	Prefix string
}

// DataKey and GroupKey name the keys.
func (c Config) DataKey(i int) string  { return fmt.Sprintf("%s/d/f%d", c.Prefix, i) }
func (c Config) GroupKey(i int) string { return fmt.Sprintf("%s/n/g%d", c.Prefix, i) }

// Setup creates the data files and group directories, empty, before the
// history starts (the model's initial state).
func Setup(ctx context.Context, c *client.Client, cfg Config) error {
	cc := c.WithContext(ctx)
	dirs := []string{cfg.Prefix + "/d", cfg.Prefix + "/n"}
	if cfg.Prefix != "" {
		dirs = append([]string{cfg.Prefix}, dirs...)
	}
	for _, d := range dirs {
		if err := cc.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("setup %s: %w", d, err)
		}
	}
	for i := 0; i < cfg.DataFiles; i++ {
		if err := cc.WriteFile(cfg.DataKey(i), nil, 0o644); err != nil {
			return fmt.Errorf("setup %s: %w", cfg.DataKey(i), err)
		}
	}
	for i := 0; i < cfg.Groups; i++ {
		if err := cc.Mkdir(cfg.GroupKey(i), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("setup %s: %w", cfg.GroupKey(i), err)
		}
	}
	return nil
}

// Stats count what the workers did.
type Stats struct {
	Ops, OK, Failed, Unknown, Discarded atomic.Int64
}

func (s *Stats) String() string {
	return fmt.Sprintf("%d ops: %d ok, %d failed with an errno, %d unknown, %d failed reads dropped",
		s.Ops.Load(), s.OK.Load(), s.Failed.Load(), s.Unknown.Load(), s.Discarded.Load())
}

// Worker is one sequential stream of operations through one client. Several
// workers may share a client (and so a session).
type Worker struct {
	ID  int // porcupine client id, unique per history
	C   *client.Client
	cfg Config
	rec *model.Recorder
	rng *rand.Rand
	st  *Stats

	closers *sync.WaitGroup   // background closes of created files
	inos    map[string]uint64 // data file inodes (never change)
	appendH map[string]uint64 // O_APPEND handles, reopened when lost
	n       int
}

// NewWorker makes worker id; its choices follow cfg.Seed and id.
func NewWorker(id int, c *client.Client, cfg Config, rec *model.Recorder, st *Stats) *Worker {
	if cfg.OpTimeout == 0 {
		cfg.OpTimeout = 5 * time.Second
	}
	return &Worker{ID: id, C: c, cfg: cfg, rec: rec, st: st,
		rng:  rand.New(rand.NewSource(cfg.Seed*7919 + int64(id))),
		inos: map[string]uint64{}, appendH: map[string]uint64{}, closers: &sync.WaitGroup{}}
}

// Run performs operations until ctx ends or MaxOps are done.
func (w *Worker) Run(ctx context.Context) {
	for i := 0; w.cfg.MaxOps == 0 || i < w.cfg.MaxOps; i++ {
		if ctx.Err() != nil {
			return
		}
		w.Step(ctx)
		if w.cfg.Pause > 0 {
			t := time.NewTimer(time.Duration(w.rng.Int63n(int64(w.cfg.Pause))))
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
}

// Step performs one random operation.
func (w *Worker) Step(ctx context.Context) { _ = w.do(ctx, w.Next()) }

// Next draws the next random operation. The sequence depends only on the
// seed and the worker's id, never on outcomes, so a failing run's
// operations can be regenerated.
func (w *Worker) Next() model.Input {
	share := w.cfg.DataShare
	switch {
	case w.cfg.Groups == 0:
		share = 1
	case w.cfg.DataFiles == 0:
		share = 0
	case share == 0:
		share = 0.5
	}
	if w.rng.Float64() < share {
		return w.dataOp(w.cfg.DataKey(w.rng.Intn(w.cfg.DataFiles)))
	}
	return w.nsOp(w.cfg.GroupKey(w.rng.Intn(w.cfg.Groups)))
}

// ReadAll reads every key once (after the faults, to check convergence).
// It returns the reads that failed other than definitely.
func (w *Worker) ReadAll(ctx context.Context) []string {
	var failed []string
	read := func(in model.Input) {
		if err := w.do(ctx, in); err != nil && (in.Kind.IsData() || !definite[client.Errno(err)]) {
			failed = append(failed, fmt.Sprintf("worker %d: %s: %v", w.ID, model.Describe(in, model.Output{Unknown: true}), err))
		}
	}
	for i := 0; i < w.cfg.DataFiles; i++ {
		read(model.Input{Kind: model.KindRead, Key: w.cfg.DataKey(i), Len: 1 << 20})
	}
	for i := 0; i < w.cfg.Groups; i++ {
		read(model.Input{Kind: model.KindReadDir, Key: w.cfg.GroupKey(i)})
		for _, t := range model.Top {
			read(model.Input{Kind: model.KindStat, Key: w.cfg.GroupKey(i), Path: t})
		}
	}
	return failed
}

func (w *Worker) token(kind string) string {
	w.n++
	return fmt.Sprintf("<%s%d.%d>", kind, w.ID, w.n)
}

func (w *Worker) dataOp(key string) model.Input {
	in := model.Input{Key: key}
	switch r := w.rng.Intn(100); {
	case r < 30:
		in.Kind, in.Off, in.Data = model.KindWrite, int64(w.rng.Intn(48)), w.token("w")
	case r < 55:
		in.Kind, in.Data = model.KindAppend, w.token("a")
	case r < 90:
		in.Kind, in.Len = model.KindRead, 1<<20
		if w.rng.Intn(4) == 0 {
			in.Off, in.Len = int64(w.rng.Intn(64)), 1+w.rng.Intn(32)
		}
	default:
		in.Kind = model.KindSize
	}
	return in
}

// Linux open flags, which the protocol uses on every OS.
const (
	oWRONLY uint32 = 0x1
	oCREAT  uint32 = 0x40
	oEXCL   uint32 = 0x80
	oAPPEND uint32 = 0x400
)

// perms are permission bits no umask changes, so a stat can be compared.
var perms = []uint32{0o400, 0o444, 0o500, 0o555, 0o600, 0o640, 0o644, 0o700, 0o750, 0o755}

func (w *Worker) nsOp(key string) model.Input {
	paths := model.NSPaths()
	p := paths[w.rng.Intn(len(paths))]
	in := model.Input{Key: key, Path: p, Perm: perms[w.rng.Intn(len(perms))]}
	switch r := w.rng.Intn(100); {
	case r < 15:
		in.Kind = model.KindCreate
	case r < 25:
		in.Kind, in.Perm = model.KindMkdir, 0o755
	case r < 40:
		in.Kind = model.KindRemove
	case r < 60:
		in.Kind = model.KindRename
		in.Path2 = samelevel(paths, p, w.rng)
	case r < 75:
		in.Kind, in.Perm = model.KindReadDir, 0
		if w.rng.Intn(2) == 0 {
			in.Path = ""
		} else {
			in.Path = model.Top[w.rng.Intn(len(model.Top))]
		}
	case r < 90:
		in.Kind, in.Perm = model.KindStat, 0
	default:
		in.Kind = model.KindChmod
	}
	return in
}

// samelevel picks a rename destination at the same depth as p.
func samelevel(paths []string, p string, rng *rand.Rand) string {
	depth := strings.Count(p, "/")
	for {
		q := paths[rng.Intn(len(paths))]
		if strings.Count(q, "/") == depth {
			return q
		}
	}
}

// definite are the errnos a namespace operation may legitimately return;
// any other error leaves its outcome unknown.
var definite = map[syscall.Errno]bool{
	syscall.ENOENT: true, syscall.EEXIST: true, syscall.ENOTDIR: true,
	syscall.EISDIR: true, syscall.ENOTEMPTY: true, syscall.EINVAL: true,
}

// Do runs one operation and records it; it returns the operation's error
// (nil when it succeeded).
func (w *Worker) Do(ctx context.Context, in model.Input) error {
	return w.do(ctx, in)
}

// do runs in and records it.
func (w *Worker) do(ctx context.Context, in model.Input) error {
	if in.Kind.IsData() {
		if err := w.prepare(ctx, in); err != nil {
			return err // nothing was invoked
		}
	}
	octx, cancel := context.WithTimeout(ctx, w.cfg.OpTimeout)
	defer cancel()
	w.st.Ops.Add(1)
	call := w.rec.Begin(w.ID, in)
	out, err := w.invoke(octx, in)
	errno := client.Errno(err)
	switch {
	case err == nil:
		w.st.OK.Add(1)
		call.End(out)
	case !in.Kind.IsData() && definite[errno]:
		w.st.Failed.Add(1)
		call.End(model.Output{Err: errno})
	case in.Kind.IsRead():
		w.st.Discarded.Add(1)
		call.Discard()
	default:
		w.st.Unknown.Add(1)
		call.End(model.Output{Unknown: true})
		if in.Kind == model.KindAppend {
			w.dropAppendHandle(in.Key)
		}
	}
	return err
}

// prepare looks up what a data operation needs before its invocation is
// recorded: the file's inode and, for appends, an O_APPEND handle.
func (w *Worker) prepare(ctx context.Context, in model.Input) error {
	octx, cancel := context.WithTimeout(ctx, w.cfg.OpTimeout)
	defer cancel()
	if _, ok := w.inos[in.Key]; !ok {
		fi, err := w.C.WithContext(octx).Stat(in.Key)
		if err != nil {
			return err
		}
		w.inos[in.Key] = fi.Sys().(*pb.Attr).GetIno()
	}
	if in.Kind == model.KindAppend && w.appendH[in.Key] == 0 {
		h, _, err := w.C.OpenLoc(octx, &pb.Loc{Path: in.Key}, oWRONLY|oAPPEND, 0o644, 0, 0, false, false)
		if err != nil {
			return err
		}
		w.appendH[in.Key] = h
	}
	return nil
}

func (w *Worker) dropAppendHandle(key string) {
	h := w.appendH[key]
	if h == 0 {
		return
	}
	delete(w.appendH, key)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = w.C.CloseHandle(ctx, h)
}

// invoke performs in against the cluster.
func (w *Worker) invoke(ctx context.Context, in model.Input) (model.Output, error) {
	cc := w.C.WithContext(ctx)
	full := path.Join(in.Key, in.Path)
	switch in.Kind {
	case model.KindWrite:
		n, _, err := w.C.WriteIno(ctx, w.inos[in.Key], in.Off, []byte(in.Data))
		return model.Output{N: int64(n)}, err
	case model.KindAppend:
		n, _, err := w.C.WriteHandle(ctx, w.appendH[in.Key], 0, []byte(in.Data))
		return model.Output{N: int64(n)}, err
	case model.KindRead:
		buf := make([]byte, in.Len)
		n, err := w.C.ReadIno(ctx, w.inos[in.Key], in.Off, buf)
		return model.Output{Data: string(buf[:n])}, err
	case model.KindSize:
		a, err := w.C.GetAttr(ctx, w.inos[in.Key])
		return model.Output{N: int64(a.GetSize())}, err
	case model.KindCreate:
		h, _, err := w.C.OpenLoc(ctx, &pb.Loc{Path: full}, oWRONLY|oCREAT|oEXCL, in.Perm, 0, 0, false, false)
		if err == nil {
			w.closeLater(h)
		}
		return model.Output{}, err
	case model.KindMkdir:
		return model.Output{}, cc.Mkdir(full, fs.FileMode(in.Perm))
	case model.KindRemove:
		return model.Output{}, cc.Remove(full)
	case model.KindRename:
		return model.Output{}, cc.Rename(full, path.Join(in.Key, in.Path2))
	case model.KindChmod:
		return model.Output{}, cc.Chmod(full, fs.FileMode(in.Perm))
	case model.KindStat:
		fi, err := cc.Stat(full)
		if err != nil {
			return model.Output{}, err
		}
		return model.Output{Dir: fi.IsDir(), Perm: uint32(fi.Mode().Perm())}, nil
	case model.KindReadDir:
		return w.clientReadDir(cc, full)
	}
	return model.Output{}, fmt.Errorf("unknown operation %v", in.Kind)
}

// clientReadDir lists a directory with client.ReadDir, which resolves the
// path and lists it in one query (it once took two, and a concurrent rename
// over the directory made it fail with ENOENT; see docs/testing.md).
func (w *Worker) clientReadDir(cc *client.Client, full string) (model.Output, error) {
	ents, err := cc.ReadDir(full)
	out := model.Output{}
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() {
			name += "/"
		}
		out.Names = append(out.Names, name)
	}
	return out, err
}

// closeLater closes a handle a create left open, off the worker's path.
func (w *Worker) closeLater(h uint64) {
	w.closers.Add(1)
	go func() {
		defer w.closers.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = w.C.CloseHandle(ctx, h)
	}()
}

// WaitClosers waits for the worker's background closes of created files.
func (w *Worker) WaitClosers() { w.closers.Wait() }
