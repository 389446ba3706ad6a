package chaos

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/test/harness"
	"github.com/memoryfs/memfs/test/model"
	"github.com/memoryfs/memfs/test/workload"
)

// The capability cases: a caching reader (workload.CachingReader, the FUSE
// layer's metadata cache over a client made WithCaps) holds capabilities
// on a data file and a namespace group while a plain client changes them.
// Every operation of both is recorded in one history and checked against
// the model, so what the cache answered is judged like any other read.

// capsRig is a 3-node cluster with a plain writer and caching readers
// recording into one history.
type capsRig struct {
	t    *testing.T
	c    *harness.Cluster
	seed int64
	cfg  workload.Config
	rec  *model.Recorder
	st   *workload.Stats
	cs   *workload.CacheStats
	w    *workload.Worker
	ids  int
}

func newCapsRig(t *testing.T, ctx context.Context) *capsRig {
	seed := workload.Seed(t)
	c := harness.Start(t, harness.Options{Nodes: 3, Seed: seed})
	g := &capsRig{t: t, c: c, seed: seed, rec: model.NewRecorder(), st: &workload.Stats{}, cs: &workload.CacheStats{},
		cfg: workload.Config{DataFiles: 1, Groups: 1, OpTimeout: 30 * time.Second, Seed: seed}}
	setup, err := connectTo(c)(ctx, "setup")
	require.NoError(t, err)
	require.NoError(t, workload.Setup(ctx, setup, g.cfg))
	_ = setup.Close()
	cl, err := connectTo(c)(ctx, "w")
	require.NoError(t, err)
	t.Cleanup(func() { _ = cl.Close() })
	g.w = workload.NewWorker(0, cl, g.cfg, g.rec, g.st)
	g.ids = 1
	return g
}

// reader connects caching reader name with lease and opTimeout per
// operation; kill makes it unreachable for good (see workload.Killable).
func (g *capsRig) reader(ctx context.Context, name string, lease, opTimeout time.Duration) (*workload.CachingReader, func()) {
	dial, kill := workload.Killable(g.c.Dialer(name))
	cl, err := g.c.Client(ctx, name, nil, workload.CachingOptions(lease, dial)...)
	require.NoError(g.t, err)
	g.t.Cleanup(func() { _ = cl.Close() })
	cfg := g.cfg
	cfg.OpTimeout = opTimeout
	r := workload.NewCachingReader(g.ids, name, cl, cfg, g.rec, g.st, g.cs)
	g.ids++
	return r, kill
}

func (g *capsRig) check() {
	g.t.Logf("workload: %v; %v", g.st, g.cs)
	model.Check(g.t, g.seed, g.rec.Operations())
}

// local runs op on r until the cache answers it without the cluster, at
// most 20 times: a keepalive or a release falling inside one operation
// hides a local answer.
func local(t *testing.T, ctx context.Context, r *workload.CachingReader, op workload.CachedOp) workload.Answer {
	t.Helper()
	var a workload.Answer
	for range 20 {
		if a = r.Do(ctx, op); a.Local {
			return a
		}
	}
	t.Fatalf("%v was never answered from the cache (last: %+v)", op.In, a)
	return a
}

// must runs op on r and requires it to succeed.
func must(t *testing.T, ctx context.Context, r *workload.CachingReader, op workload.CachedOp) model.Output {
	t.Helper()
	a := r.Do(ctx, op)
	require.Zero(t, a.Errno, "%v", op.In)
	return a.Out
}

// TestCachingReaderRecall: every change a plain client makes to what a
// caching reader holds waits for a recall, which the reader answers by
// dropping its cache and releasing (well before its lease would revoke
// it), and the reader's next answer, right after the change returned,
// already shows it.
func TestCachingReaderRecall(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := newCapsRig(t, ctx)
	const lease = 10 * time.Second
	r, _ := g.reader(ctx, "k0", lease, 30*time.Second)
	f, grp := g.cfg.DataKey(0), g.cfg.GroupKey(0)

	// change runs a command of the writer and requires it to have waited
	// for a recall the reader answered.
	change := func(in model.Input) {
		t.Helper()
		recalls, start := g.cs.Recalls.Load(), time.Now()
		require.NoError(t, g.w.Do(ctx, in), "%v", in)
		took := time.Since(start)
		require.Greater(t, g.cs.Recalls.Load(), recalls, "%v did not recall the reader's capability", in)
		require.Less(t, took, lease/2, "%v waited for a revocation, not for the reader's release", in)
	}

	// The reader holds the file once it looked it up.
	require.EqualValues(t, 0, must(t, ctx, r, workload.Size(f, true)).N)
	local(t, ctx, r, workload.Size(f, false))
	change(model.Input{Kind: model.KindAppend, Key: f, Data: "<a0>"})
	require.EqualValues(t, 4, must(t, ctx, r, workload.Size(f, false)).N)
	require.Equal(t, "<a0>", must(t, ctx, r, workload.Read(f)).Data)
	local(t, ctx, r, workload.Size(f, true))
	change(model.Input{Kind: model.KindWrite, Key: f, Off: 2, Data: "<w1>"})
	require.EqualValues(t, 6, must(t, ctx, r, workload.Size(f, true)).N)
	require.Equal(t, "<a<w1>", must(t, ctx, r, workload.Read(f)).Data)

	// The group: a missing name is answered from the cached listing too.
	require.Equal(t, syscall.ENOENT, r.Do(ctx, workload.Stat(grp, "a")).Errno)
	require.Empty(t, local(t, ctx, r, workload.List(grp)).Out.Names)
	change(model.Input{Kind: model.KindCreate, Key: grp, Path: "a", Perm: 0o644})
	st := must(t, ctx, r, workload.Stat(grp, "a"))
	require.Equal(t, model.Output{Perm: 0o644}, st)
	local(t, ctx, r, workload.Stat(grp, "a"))
	change(model.Input{Kind: model.KindChmod, Key: grp, Path: "a", Perm: 0o600})
	require.EqualValues(t, 0o600, must(t, ctx, r, workload.Stat(grp, "a")).Perm)
	local(t, ctx, r, workload.List(grp))
	change(model.Input{Kind: model.KindRename, Key: grp, Path: "a", Path2: "b"})
	require.Equal(t, []string{"b"}, must(t, ctx, r, workload.List(grp)).Names)
	require.Equal(t, syscall.ENOENT, r.Do(ctx, workload.Stat(grp, "a")).Errno)
	change(model.Input{Kind: model.KindMkdir, Key: grp, Path: "c", Perm: 0o755})
	require.ElementsMatch(t, []string{"b", "c/"}, must(t, ctx, r, workload.List(grp)).Names)
	local(t, ctx, r, workload.Stat(grp, "b"))
	change(model.Input{Kind: model.KindRemove, Key: grp, Path: "b"})
	require.Equal(t, syscall.ENOENT, r.Do(ctx, workload.Stat(grp, "b")).Errno)
	require.Equal(t, []string{"c/"}, must(t, ctx, r, workload.List(grp)).Names)
	g.check()
}

// TestCachingReaderFrozen: a caching reader holding a capability is frozen
// (its links to every node stall) while it keeps answering from its cache;
// a plain client's write to the file it holds is recalled, cannot be
// released, and passes only once the cluster took the capability back, a
// lease after the recall (or with the reader's expired session). By then
// the reader must have stopped answering from its cache: it stops trusting
// its capabilities a margin before the cluster can revoke them. The three
// ways to freeze: both directions (a stopped process), deaf (its renewals
// reach the cluster, the recall never reaches it: the revocation itself is
// what lets the write through) and mute (it sees the recall and drops its
// cache, but its release never arrives).
func TestCachingReaderFrozen(t *testing.T) {
	for _, mode := range []string{"both", "deaf", "mute"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			cachingReaderFrozen(t, mode)
		})
	}
}

// stamped is one answer of a reader with when its call began and ended.
type stamped struct {
	workload.Answer
	began, ended time.Time
}

func cachingReaderFrozen(t *testing.T, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := newCapsRig(t, ctx)
	const lease = cacherLease
	// Operations the cluster must answer fail fast while frozen, so that
	// the reader keeps trying its cache.
	r, _ := g.reader(ctx, "k0", lease, 300*time.Millisecond)
	f := g.cfg.DataKey(0)
	require.EqualValues(t, 0, must(t, ctx, r, workload.Size(f, true)).N)
	local(t, ctx, r, workload.Size(f, false))

	frozen := time.Now()
	for _, id := range g.c.IDs() {
		if mode != "mute" {
			g.c.Net.Block(id, "k0")
		}
		if mode != "deaf" {
			g.c.Net.Block("k0", id)
		}
	}
	// The reader stats the file over and over while frozen.
	var mu sync.Mutex
	var answers []stamped
	stop := make(chan struct{})
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for k := 0; k < 100_000; k++ {
			began := time.Now()
			a := r.Do(ctx, workload.Size(f, false))
			mu.Lock()
			answers = append(answers, stamped{a, began, time.Now()})
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	countAfter := func(t0 time.Time, onlyLocal bool) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, a := range answers {
			if a.began.After(t0) && (a.Local || !onlyLocal) {
				n++
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return countAfter(frozen, true) > 0 }, lease, time.Millisecond,
		"the frozen reader never answered from its cache: the test checks nothing")

	writeStart := time.Now()
	require.NoError(t, g.w.Do(ctx, model.Input{Kind: model.KindAppend, Key: f, Data: "<a0>"}))
	written := time.Now()
	took := written.Sub(writeStart)
	t.Logf("the write waited %v for the frozen reader's capability", took)
	least := lease / 2
	if mode == "deaf" {
		// The session stays alive: only the revocation, a lease after
		// the recall, lets the write through.
		least = lease * 9 / 10
	}
	require.GreaterOrEqual(t, took, least, "the write passed before the frozen reader's capability could be revoked")
	require.Less(t, took, lease+10*time.Second, "the frozen reader held the write up for more than its lease")

	// Still frozen, the reader goes on trying: nothing it answers may
	// come from its cache.
	require.Eventually(t, func() bool { return countAfter(written, false) >= 3 }, 10*time.Second, time.Millisecond)
	// assert, not require: the history check below must still run and
	// report the stale answers as a violation.
	assert.Zero(t, countAfter(written, true), "the frozen reader answered from its cache after its capability was revoked")
	g.c.Net.Heal()
	healed := time.Now()
	// Thawed, it catches up and answers the new size.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, a := range answers {
			if a.began.After(healed) && a.Errno == 0 {
				return true
			}
		}
		return false
	}, 30*time.Second, time.Millisecond, "the thawed reader answered nothing")
	close(stop)
	<-loopDone
	for _, a := range answers {
		if a.began.After(healed) && a.Errno == 0 {
			assert.EqualValues(t, 4, a.Out.N, "the thawed reader answered a stale size")
		}
	}
	t.Logf("%d answers, %d from the cache during the freeze", len(answers), countAfter(frozen, true)-countAfter(healed, true))
	g.check()
}

// TestCachingReaderKilled: a caching reader dies while it holds
// capabilities on a file and a group. Closed (its session ends) it holds
// nobody up; killed (it never reaches the cluster again, its session
// lives on until its lease runs out) it delays a plain client's change by
// at most its lease. A fresh caching reader then sees every change.
func TestCachingReaderKilled(t *testing.T) {
	for _, mode := range []string{"close", "kill"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			cachingReaderKilled(t, mode)
		})
	}
}

func cachingReaderKilled(t *testing.T, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := newCapsRig(t, ctx)
	const lease = cacherLease
	r, kill := g.reader(ctx, "k0", lease, 30*time.Second)
	f, grp := g.cfg.DataKey(0), g.cfg.GroupKey(0)
	require.EqualValues(t, 0, must(t, ctx, r, workload.Size(f, true)).N)
	local(t, ctx, r, workload.Size(f, false))
	require.Equal(t, syscall.ENOENT, r.Do(ctx, workload.Stat(grp, "a")).Errno)
	local(t, ctx, r, workload.List(grp))

	var closed sync.WaitGroup
	if mode == "close" {
		require.NoError(t, r.C.Close())
	} else {
		kill()
		g.c.Net.ResetConns("k0")
		closed.Add(1)
		go func() { defer closed.Done(); _ = r.C.Close() }()
	}
	start := time.Now()
	require.NoError(t, g.w.Do(ctx, model.Input{Kind: model.KindAppend, Key: f, Data: "<a0>"}))
	require.NoError(t, g.w.Do(ctx, model.Input{Kind: model.KindCreate, Key: grp, Path: "a", Perm: 0o644}))
	took := time.Since(start)
	t.Logf("the changes waited %v for the %s reader's capabilities", took, mode)
	if mode == "close" {
		require.Less(t, took, lease/2, "the closed reader's session did not take its capabilities with it")
	} else {
		// Its session expires at the earliest two thirds of a lease
		// after its last renewal.
		require.GreaterOrEqual(t, took, lease/2, "the changes passed while the dead reader's capabilities should still stand")
		require.Less(t, took, lease+10*time.Second, "the dead reader held the changes up for more than its lease")
	}
	closed.Wait()

	r2, _ := g.reader(ctx, "k1", lease, 30*time.Second)
	require.EqualValues(t, 4, must(t, ctx, r2, workload.Size(f, false)).N)
	require.Equal(t, model.Output{Perm: 0o644}, must(t, ctx, r2, workload.Stat(grp, "a")))
	require.Equal(t, []string{"a"}, must(t, ctx, r2, workload.List(grp)).Names)
	g.check()
}

// TestCachingReaderSessionExpired reproduces the capability bug the soak
// found (docs/testing.md, "Bugs the suite found"): a caching reader whose
// session expires at the cluster while it is cut off loses its
// capabilities without a recall, so the mount keeps what it cached under
// them; once a grant in the new session covers such an inode again, the
// mount answers from the old entries. Here: the reader lists a group (a
// capability on it and its listing, empty), its requests stall (mute: the
// change stream stays open) until its session expired, a plain client
// creates a in the group (no capability stands in its way: it returns at
// once), the reader thaws and opens a new session, a getattr of the
// group's directory grants it a capability on the group alone, and the
// lookup of a and the listing were answered from the listing cached in
// the old session: ENOENT and [] after the create returned. (Fixed: the
// capability table hands the old session's inodes to OnRecall before it
// holds anything of the new one.)
func TestCachingReaderSessionExpired(t *testing.T) {
	for _, mode := range []string{"mute", "deaf"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			cachingReaderSessionExpired(t, mode)
		})
	}
}

func cachingReaderSessionExpired(t *testing.T, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := newCapsRig(t, ctx)
	const lease = cacherLease
	r, _ := g.reader(ctx, "k0", lease, 5*time.Second)
	f, grp := g.cfg.DataKey(0), g.cfg.GroupKey(0)
	require.Equal(t, syscall.ENOENT, r.Do(ctx, workload.Stat(grp, "a")).Errno)
	require.Empty(t, local(t, ctx, r, workload.List(grp)).Out.Names)
	fi, err := g.w.C.WithContext(ctx).Stat(grp)
	require.NoError(t, err)
	grpIno := fi.Sys().(*pb.Attr).GetIno()
	s1 := r.C.Session()

	for _, id := range g.c.IDs() {
		if mode == "mute" {
			g.c.Net.Block("k0", id)
		} else {
			g.c.Net.Block(id, "k0")
		}
	}
	// The cluster expires a session when it applies an entry past the
	// lease: the writer's appends (to a file the reader never held) are
	// those entries, until the reader's session is gone.
	gone := false
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for k := 0; k < 400 && !gone; k++ {
		require.NoError(t, g.w.Do(ctx, model.Input{Kind: model.KindAppend, Key: f, Data: fmt.Sprintf("<p%d>", k)}))
		st, err := g.w.C.Status(ctx)
		require.NoError(t, err)
		if gone = st.GetSessions() == 1; !gone {
			<-tick.C
		}
	}
	require.True(t, gone, "the cut-off reader's session did not expire")
	start := time.Now()
	require.NoError(t, g.w.Do(ctx, model.Input{Kind: model.KindCreate, Key: grp, Path: "a", Perm: 0o644}))
	require.Less(t, time.Since(start), lease/2, "the create waited: the expired session's capability still stood")

	g.c.Net.Heal()
	require.Eventually(t, func() bool { return r.C.Session() != s1 }, 30*time.Second, time.Millisecond,
		"the reader did not open a new session")
	// A getattr of the group's directory (the kernel makes them all the
	// time) grants the reader a capability on it in the new session.
	_, e := r.Ops.GetAttr(ctx, grpIno)
	require.Zero(t, e)
	st := r.Do(ctx, workload.Stat(grp, "a"))
	ls := r.Do(ctx, workload.List(grp))
	t.Logf("after the create returned: stat a → %+v (local %v), list → %+v (local %v)", st.Out, st.Local, ls.Out, ls.Local)
	assert.Equal(t, model.Output{Perm: 0o644}, st.Out, "stat of a created before, answered from the old session's listing")
	assert.Equal(t, []string{"a"}, ls.Out.Names, "listing answered from the old session's cache")
	g.check()
}
