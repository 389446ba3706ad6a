package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Journal holds the operations a holder of exclusive capabilities has
// answered itself and not yet committed (docs/protocol.md, "Buffered
// operations"). They go to the cluster in order, in batches, each one
// BatchCmd applied atomically and fenced by the capabilities the
// operations were answered under. So the cluster always holds a prefix of
// what was appended: never a later operation without an earlier one.
//
// Every other command of the client, and every query that reads an inode
// an operation not yet committed names, first waits until everything
// appended before it is committed, and so does the release of a recalled
// capability: the journal is never overtaken, and whoever the cluster
// makes wait for a recall sees every operation answered before it.
//
// A Journal never decides whether an operation may be buffered: its user
// does, under Admit, from the state its exclusive capabilities guarantee.
type Journal struct {
	c   *Client
	opt JournalOptions

	// admit is held shared from the check that an operation may be
	// buffered until it is appended, and exclusively by a release of
	// recalled capabilities while it syncs: an operation is either in
	// the journal before the release or sees the capability gone.
	admit sync.RWMutex

	mu       sync.Mutex
	ops      []jop          // guarded by mu: appended, not yet taken by a batch
	bytes    int            // guarded by mu: size of ops
	touched  map[uint64]int // guarded by mu: ino → operations naming it, not yet committed
	appended uint64         // guarded by mu: operations appended so far
	done     uint64         // guarded by mu: operations committed or failed so far
	ended    chan struct{}  // guarded by mu: closed and replaced when a batch ends
	timer    *time.Timer    // guarded by mu: the age bound of the oldest operation
	errs     map[uint64]error

	sendMu sync.Mutex // one batch at a time, in order

	inoMu  sync.Mutex
	ranges []inoRange // guarded by inoMu: reserved inode numbers not yet used
	filler chan struct{}

	onCommit []func(ops []Buffered, res []*pb.Result, err error)
	kick     chan struct{}
	stop     context.CancelFunc
	stopped  chan struct{}

	batches, committed, failed atomic.Int64
	flushNanos                 atomic.Int64 // time spent sending batches, all of them
}

// JournalOptions bound how long and how much a journal buffers before it
// sends a batch on its own.
type JournalOptions struct {
	MaxAge   time.Duration // the oldest operation waits at most this long (100 ms)
	MaxOps   int           // operations per batch (1024)
	MaxBytes int           // encoded bytes per batch (512 KiB)
}

// Buffered is one operation as appended: the command (its Op and
// StampNs), the inodes it names (its directories, its target, the inode
// it creates) and the capabilities it was answered under.
type Buffered struct {
	Cmd     *pb.Command
	Inos    []uint64
	Fences  []*pb.CapRef
	Created uint64 // the inode it creates with a reserved number, or 0
}

type jop struct {
	Buffered
	size int
}

type inoRange struct {
	session, next, end, gen uint64
}

// inoChunk is how many inode numbers one reservation asks for.
const inoChunk = 1024

// ErrFenced is the error of operations a batch lost because a capability
// they were answered under was no longer held when it arrived.
var ErrFenced = errors.New("memfs: buffered operations refused: a capability they relied on was revoked")

// StartJournal begins buffering for a client made WithCaps: until Close,
// the client's other calls wait for what was appended before them.
func (c *Client) StartJournal(opt JournalOptions) (*Journal, error) {
	if c.k.caps == nil {
		return nil, errors.New("memfs: a journal needs a client made WithCaps")
	}
	if opt.MaxAge <= 0 {
		opt.MaxAge = 100 * time.Millisecond
	}
	if opt.MaxOps <= 0 {
		opt.MaxOps = 1024
	}
	if opt.MaxBytes <= 0 {
		opt.MaxBytes = 512 << 10
	}
	ctx, cancel := context.WithCancel(context.Background())
	j := &Journal{
		c: c, opt: opt, touched: map[uint64]int{}, ended: make(chan struct{}), errs: map[uint64]error{},
		filler: make(chan struct{}, 1), kick: make(chan struct{}, 1), stop: cancel, stopped: make(chan struct{}),
	}
	if !c.k.journal.CompareAndSwap(nil, j) {
		cancel()
		return nil, errors.New("memfs: the client already has a journal")
	}
	go j.run(ctx)
	return j, nil
}

// Journal returns the client's journal, or nil.
func (c *Client) Journal() *Journal { return c.k.journal.Load() }

// OnCommit adds fn to the functions called after each batch with its
// operations and their results (err set and res nil when they were lost).
// Register before the first Append.
func (j *Journal) OnCommit(fn func(ops []Buffered, res []*pb.Result, err error)) {
	j.onCommit = append(j.onCommit, fn)
}

// Admit must bracket the decision to buffer an operation and its Append:
// call the function it returns after Append (or after deciding not to).
func (j *Journal) Admit() func() {
	j.admit.RLock()
	return j.admit.RUnlock
}

// Append adds an operation. Its command's stamp_ns should be the time the
// operation was answered with (now when 0).
func (j *Journal) Append(b Buffered) {
	if b.Cmd.StampNs == 0 {
		b.Cmd.StampNs = time.Now().UnixNano()
	}
	size := sizeOf(b.Cmd)
	j.mu.Lock()
	j.ops = append(j.ops, jop{Buffered: b, size: size})
	j.bytes += size
	j.appended++
	for _, ino := range b.Inos {
		j.touched[ino]++
	}
	full := len(j.ops) >= j.opt.MaxOps || j.bytes >= j.opt.MaxBytes
	if len(j.ops) == 1 && !full {
		j.timer = time.AfterFunc(j.opt.MaxAge, j.wake)
	}
	j.mu.Unlock()
	if full {
		j.wake()
	}
}

func sizeOf(cmd *pb.Command) int {
	return len(cmd.GetWrite().GetData()) + 64
}

func (j *Journal) wake() {
	select {
	case j.kick <- struct{}{}:
	default:
	}
}

// Pending reports whether operations wait to be committed.
func (j *Journal) Pending() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.done < j.appended
}

// Touches reports whether an operation not yet committed names one of
// inos.
func (j *Journal) Touches(inos ...uint64) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, ino := range inos {
		if j.touched[ino] > 0 {
			return true
		}
	}
	return false
}

// Sync returns once every operation appended before the call is committed
// or failed (the failures are reported by TakeErr).
func (j *Journal) Sync(ctx context.Context) error {
	j.mu.Lock()
	target := j.appended
	j.mu.Unlock()
	for {
		j.mu.Lock()
		done := j.done
		j.mu.Unlock()
		if done >= target {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		j.sendOne(ctx)
	}
}

// SyncMoving is Sync with a limit for a journal that stops moving, not
// for a long one: it gives up when no operation was committed or lost for
// stall, however long the whole takes (tens of thousands of operations
// may take longer than one operation's time limit, batch after batch).
func (j *Journal) SyncMoving(ctx context.Context, stall time.Duration) error {
	for {
		_, committed, lost := j.Stats()
		sctx, cancel := context.WithTimeout(ctx, stall)
		err := j.Sync(sctx)
		cancel()
		if err == nil {
			return nil
		}
		_, nowCommitted, nowLost := j.Stats()
		if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) || nowCommitted+nowLost == committed+lost {
			return err
		}
	}
}

// TakeErr returns and forgets the first commit failure of an operation
// that named ino.
func (j *Journal) TakeErr(ino uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	err := j.errs[ino]
	delete(j.errs, ino)
	return err
}

// Stats counts batches sent, operations committed and operations lost.
func (j *Journal) Stats() (batches, committed, failed int64) {
	return j.batches.Load(), j.committed.Load(), j.failed.Load()
}

// Depth is the number of operations appended and not yet committed or
// lost: what a crash of this client now would lose.
func (j *Journal) Depth() int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return int64(j.appended - j.done)
}

// FlushTime is the time spent sending batches until the cluster answered,
// summed over every batch Stats counts (retries included).
func (j *Journal) FlushTime() time.Duration { return time.Duration(j.flushNanos.Load()) }

// Close commits what is buffered and stops the journal.
func (j *Journal) Close(ctx context.Context) error {
	err := j.Sync(ctx)
	j.stop()
	<-j.stopped
	j.c.k.journal.CompareAndSwap(j, nil)
	return err
}

func (j *Journal) run(ctx context.Context) {
	defer close(j.stopped)
	for {
		select {
		case <-ctx.Done():
			return
		case <-j.kick:
		case <-j.filler:
			j.reserve(ctx)
			continue
		}
		j.mu.Lock()
		due := len(j.ops) > 0
		j.mu.Unlock()
		if due {
			j.sendOne(ctx)
		}
	}
}

// sendOne sends the next batch, or waits for the one in flight.
func (j *Journal) sendOne(ctx context.Context) {
	j.sendMu.Lock()
	defer j.sendMu.Unlock()
	j.mu.Lock()
	n, bytes := 0, 0
	for n < len(j.ops) && n < j.opt.MaxOps && (n == 0 || bytes+j.ops[n].size <= j.opt.MaxBytes) {
		bytes += j.ops[n].size
		n++
	}
	batch := make([]Buffered, n)
	for i := range n {
		batch[i] = j.ops[i].Buffered
	}
	j.ops = j.ops[n:]
	j.bytes -= bytes
	if j.timer != nil && len(j.ops) == 0 {
		j.timer.Stop()
	}
	if len(j.ops) > 0 {
		j.wake() // what is left is due too: it waited as long
	}
	j.mu.Unlock()
	if n == 0 {
		return
	}
	// The batch has its own time limit: the caller that sends it may be
	// one of many waiting for it.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), j.c.k.cfg.retryTimeout)
	defer cancel()
	// An error that is not an errno leaves unknown whether the batch
	// applied (the cluster was out of reach for the whole retry time):
	// its operations count as lost, and what the cluster holds is what
	// later calls see.
	res, err := j.commit(bctx, batch)
	j.finish(batch, res, err)
}

// commit sends ops as one batch. When the cluster refuses it for one
// operation (ENOSPC past the memory budget, a name another session took
// after a revocation), the operations are sent again one batch each, so
// that all but the refused ones are kept; a fencing refusal loses them all.
func (j *Journal) commit(ctx context.Context, ops []Buffered) ([]*pb.Result, error) {
	res, err := j.send(ctx, ops)
	var e syscall.Errno
	if err == nil || !errors.As(err, &e) || e == syscall.EKEYREVOKED || len(ops) == 1 {
		return res, err
	}
	res = make([]*pb.Result, len(ops))
	for i := range ops {
		r, err := j.send(ctx, ops[i:i+1])
		switch {
		case err == nil:
			res[i] = r[0]
		case errors.As(err, &e):
			res[i] = &pb.Result{Errno: uint32(e), Message: err.Error()}
		default:
			return nil, err
		}
	}
	return res, nil
}

// send applies ops as one BatchCmd.
func (j *Journal) send(ctx context.Context, ops []Buffered) ([]*pb.Result, error) {
	caps := j.c.k.caps
	defer caps.Expect()()
	b := &pb.BatchCmd{Commands: make([]*pb.Command, len(ops))}
	fenced := map[uint64]uint64{}
	for i, op := range ops {
		b.Commands[i] = op.Cmd
		for _, f := range op.Fences {
			fenced[f.Ino] = max(fenced[f.Ino], f.Epoch)
		}
	}
	for ino, epoch := range fenced {
		b.Fences = append(b.Fences, &pb.CapRef{Ino: ino, Epoch: epoch})
	}
	j.batches.Add(1)
	start := time.Now()
	res, err := j.c.k.apply(ctx, &pb.Command{Op: &pb.Command_Batch{Batch: b}}, 0)
	j.flushNanos.Add(int64(time.Since(start)))
	if err != nil {
		return nil, fmt.Errorf("batch of %d: %w", len(ops), err)
	}
	if e := res.GetErrno(); e != 0 {
		if e == uint32(syscall.EKEYREVOKED) {
			return nil, fmt.Errorf("batch of %d: %w (%w)", len(ops), ErrFenced, syscall.Errno(e))
		}
		return nil, fmt.Errorf("batch of %d: %s: %w", len(ops), res.GetMessage(), syscall.Errno(e))
	}
	if len(res.GetResults()) != len(ops) {
		return nil, fmt.Errorf("batch of %d answered with %d results: %w", len(ops), len(res.GetResults()), syscall.EIO)
	}
	for i, op := range ops {
		if r := res.GetResults()[i]; op.Created != 0 && r.GetErrno() == 0 {
			caps.adopt(op.Created, r.GetEpoch(), true)
		}
	}
	return res.GetResults(), nil
}

// finish counts a batch's operations done and reports their failures.
func (j *Journal) finish(ops []Buffered, res []*pb.Result, err error) {
	j.mu.Lock()
	for i, op := range ops {
		var opErr error
		switch {
		case err != nil:
			opErr = err
		case res[i].GetErrno() != 0:
			opErr = fmt.Errorf("%s: %w", res[i].GetMessage(), syscall.Errno(res[i].GetErrno()))
		}
		for _, ino := range op.Inos {
			if j.touched[ino]--; j.touched[ino] <= 0 {
				delete(j.touched, ino)
			}
			if opErr != nil && j.errs[ino] == nil {
				j.errs[ino] = opErr
			}
		}
		if opErr != nil {
			j.failed.Add(1)
			j.c.k.cfg.log.Error("memfs: a buffered operation was lost at commit", "op", opName(op.Cmd), "inos", op.Inos, "err", opErr)
		} else {
			j.committed.Add(1)
		}
	}
	j.done += uint64(len(ops))
	close(j.ended)
	j.ended = make(chan struct{})
	j.mu.Unlock()
	for _, fn := range j.onCommit {
		fn(ops, res, err)
	}
}

// Ino hands out a reserved inode number and the generation an inode made
// with it gets. It reserves more in the background when few are left, and
// waits for a reservation only when none is.
func (j *Journal) Ino(ctx context.Context) (ino, gen uint64, err error) {
	session := j.c.Session()
	for {
		j.inoMu.Lock()
		for len(j.ranges) > 0 && (j.ranges[0].session != session || j.ranges[0].next >= j.ranges[0].end) {
			j.ranges = j.ranges[1:]
		}
		left := uint64(0)
		for _, r := range j.ranges {
			left += r.end - r.next
		}
		if len(j.ranges) > 0 {
			r := &j.ranges[0]
			ino, gen = r.next, r.gen
			r.next++
		}
		j.inoMu.Unlock()
		if left <= inoChunk/2 {
			select {
			case j.filler <- struct{}{}:
			default:
			}
		}
		if ino != 0 {
			return ino, gen, nil
		}
		if err := j.reserve(ctx); err != nil {
			return 0, 0, err
		}
	}
}

// reserve asks the cluster for another range of inode numbers.
func (j *Journal) reserve(ctx context.Context) error {
	cmd := &pb.Command{Op: &pb.Command_ReserveInodes{ReserveInodes: &pb.ReserveInodesCmd{Count: inoChunk}}}
	res, err := j.c.k.apply(ctx, cmd, 0)
	if err != nil {
		return fmt.Errorf("reserve inodes: %w", err)
	}
	if e := res.GetErrno(); e != 0 {
		return fmt.Errorf("reserve inodes: %s: %w", res.GetMessage(), syscall.Errno(e))
	}
	j.inoMu.Lock()
	j.ranges = append(j.ranges, inoRange{session: cmd.Session, next: res.GetFirstIno(), end: res.GetFirstIno() + inoChunk, gen: res.GetEpoch()})
	j.inoMu.Unlock()
	return nil
}

// settleCommand waits for the journal before a command that must not
// overtake it: every command but those that only concern capabilities,
// reservations and the session, and the journal's own batches.
func (k *core) settleCommand(ctx context.Context, cmd *pb.Command) error {
	j := k.journal.Load()
	if j == nil {
		return nil
	}
	switch op := cmd.Op.(type) {
	case *pb.Command_Batch, *pb.Command_Grant, *pb.Command_KeepAlive, *pb.Command_ReserveInodes,
		*pb.Command_Touch, *pb.Command_OpenSession, *pb.Command_Tick:
		return nil
	case *pb.Command_Release:
		// A release lets a waiting command of another session run: it
		// must see what was answered under the capability first.
		// releaseCaps holds admit around it.
		inos := make([]uint64, len(op.Release.GetCaps()))
		for i, r := range op.Release.GetCaps() {
			inos[i] = r.GetIno()
		}
		if !j.Touches(inos...) {
			return nil
		}
	}
	if !j.Pending() {
		return nil
	}
	return j.Sync(ctx)
}

// settleQuery waits for the journal before a read that may see what an
// operation not yet committed changes: one naming such an inode by number,
// and any that finds an inode by name (the name may lead to one) or lists
// attributes.
func (k *core) settleQuery(ctx context.Context, q *pb.Query) error {
	j := k.journal.Load()
	if j == nil || !j.Pending() {
		return nil
	}
	var loc *pb.Loc
	switch x := q.Q.(type) {
	case *pb.Query_Stat:
		loc = x.Stat.GetLoc()
	case *pb.Query_Read:
		if x.Read.GetLoc() == nil {
			return nil // by handle: a file opened through the cluster
		}
		loc = x.Read.GetLoc()
	case *pb.Query_ReadDir:
		if x.ReadDir.GetPlus() {
			return j.Sync(ctx)
		}
		loc = x.ReadDir.GetLoc()
	case *pb.Query_Readlink:
		loc = x.Readlink.GetLoc()
	case *pb.Query_GetXattr:
		loc = x.GetXattr.GetLoc()
	case *pb.Query_ListXattr:
		loc = x.ListXattr.GetLoc()
	case *pb.Query_Seek:
		loc = x.Seek.GetLoc()
	case *pb.Query_Handle:
		return nil
	case *pb.Query_Lock:
		// A test of a lock names an inode this client may have made and
		// not sent yet; a waiter's poll follows its own command, which
		// waited for the journal.
		if x.Lock.GetWaiter() != 0 {
			return nil
		}
		loc = &pb.Loc{Ino: x.Lock.GetIno()}
	}
	if loc != nil && loc.GetPath() == "" && loc.GetName() == "" && !j.Touches(loc.GetIno()) {
		return nil
	}
	return j.Sync(ctx)
}
