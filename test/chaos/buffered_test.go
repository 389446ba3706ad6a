package chaos

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/test/model"
	"github.com/memoryfs/memfs/test/workload"
)

// The buffering cases: a caching reader whose mount buffers metadata
// (fsops.Options{Buffered: true}) answers creates, mkdirs and renames in a
// group it holds exclusively before the cluster has them. Its answers
// enter the history once a sync of its journal confirms them, and are
// voided (changes of unknown outcome, reads left out) when it is killed
// first or the journal loses operations (test/workload/buffering.go).

// bufReader connects a buffering caching reader; its journal sends only
// when synced, recalled or full (MaxAge an hour), so that the test sees
// what stays buffered.
func (g *capsRig) bufReader(ctx context.Context, name string, lease, opTimeout time.Duration) (*workload.CachingReader, func()) {
	dial, kill := workload.Killable(g.c.Dialer(name))
	cl, err := g.c.Client(ctx, name, nil, workload.BufferingOptions(lease, dial)...)
	require.NoError(g.t, err)
	g.t.Cleanup(func() { _ = cl.Close() })
	cfg := g.cfg
	cfg.OpTimeout = opTimeout
	r := workload.NewBufferingReaders(g.ids, 1, name, cl, client.JournalOptions{MaxAge: time.Hour}, cfg, g.rec, g.st, g.cs)[0]
	require.True(g.t, r.Buffering(), "the mount did not start a journal")
	g.t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = cl.Journal().Close(ctx)
	})
	g.ids++
	return r, kill
}

// mustChange runs a mutation on r and requires it to succeed.
func mustChange(t *testing.T, ctx context.Context, r *workload.CachingReader, in model.Input) workload.Answer {
	t.Helper()
	a := r.Do(ctx, workload.Change(in))
	require.Zero(t, a.Errno, "%v", in)
	return a
}

// TestBufferingCacherRecall: a buffering reader's creates, mkdir and
// rename in a group it holds exclusively are answered without sending
// anything (the journal sends no batch); a plain client's listing of the
// group recalls the capability, which makes the reader send its journal
// before it releases, so the listing, well before the lease could revoke
// anything, shows every change; so does a plain client's create (a change
// that recalls), which finds the name taken. A sync then confirms the
// reader's answers, and the history holds them as they returned.
func TestBufferingCacherRecall(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := newCapsRig(t, ctx)
	const lease = 10 * time.Second
	r, _ := g.bufReader(ctx, "k0", lease, 30*time.Second)
	grp := g.cfg.GroupKey(0)
	jr := r.C.Journal()

	// recalled runs a command or read of the writer and requires it to
	// have waited for a recall the reader answered, not a revocation.
	recalled := func(in model.Input) error {
		t.Helper()
		recalls, start := g.cs.Recalls.Load(), time.Now()
		err := g.w.Do(ctx, in)
		took := time.Since(start)
		require.Greater(t, g.cs.Recalls.Load(), recalls, "%v did not recall the reader's capability", in)
		require.Less(t, took, lease/2, "%v waited for a revocation, not for the reader's release", in)
		return err
	}

	// The first change takes the group's exclusive capability and
	// listing; the next ones are answered from them.
	mustChange(t, ctx, r, model.Input{Kind: model.KindCreate, Key: grp, Path: "a", Perm: 0o644})
	local := 0
	for _, in := range []model.Input{
		{Kind: model.KindMkdir, Key: grp, Path: "b", Perm: 0o755},
		{Kind: model.KindRename, Key: grp, Path: "a", Path2: "c"},
		{Kind: model.KindCreate, Key: grp, Path: "a", Perm: 0o600},
	} {
		if mustChange(t, ctx, r, in).Local {
			local++
		}
	}
	require.Equal(t, syscall.EEXIST, r.Do(ctx, workload.Change(model.Input{Kind: model.KindMkdir, Key: grp, Path: "c", Perm: 0o755})).Errno)
	require.ElementsMatch(t, []string{"a", "b/", "c"}, must(t, ctx, r, workload.List(grp)).Names)
	batches, _, _ := jr.Stats()
	require.Zero(t, batches, "the journal sent a batch before any recall or sync")
	require.Positive(t, local, "no change was answered without the cluster")
	require.True(t, jr.Pending())

	// A plain client's read recalls the group: the journal goes first.
	require.NoError(t, recalled(model.Input{Kind: model.KindReadDir, Key: grp}))
	require.False(t, jr.Pending(), "the recall was released before the journal was sent")
	_, committed, lost := jr.Stats()
	require.EqualValues(t, 4, committed)
	require.Zero(t, lost)

	// Buffer again (c replaces a), then a plain client's change recalls
	// it: c is free.
	mustChange(t, ctx, r, model.Input{Kind: model.KindRename, Key: grp, Path: "c", Path2: "a"})
	require.NoError(t, recalled(model.Input{Kind: model.KindCreate, Key: grp, Path: "c", Perm: 0o644}),
		"the plain create did not see the buffered rename")
	require.NoError(t, g.w.Do(ctx, model.Input{Kind: model.KindChmod, Key: grp, Path: "a", Perm: 0o640}))
	require.Equal(t, model.Output{Perm: 0o640}, must(t, ctx, r, workload.Stat(grp, "a")))

	require.NoError(t, r.Sync(ctx))
	require.Zero(t, g.cs.Voided.Load())
	require.EqualValues(t, 8, g.cs.Confirmed.Load(), "every answer of the reader is confirmed")
	g.check()
}

// TestBufferingCacherKilled: a buffering reader's answers that a sync
// confirmed stand after it is killed; those it answered after its last
// sync are lost with it (the cluster never got them: the plain client,
// once the dead reader's capability is revoked, sees none of them) and
// are voided in the history, where recorded as completed they would be a
// violation.
func TestBufferingCacherKilled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := newCapsRig(t, ctx)
	const lease = cacherLease
	r, kill := g.bufReader(ctx, "k0", lease, 30*time.Second)
	grp := g.cfg.GroupKey(0)

	mustChange(t, ctx, r, model.Input{Kind: model.KindCreate, Key: grp, Path: "a", Perm: 0o644})
	require.NoError(t, r.Sync(ctx))
	require.EqualValues(t, 1, g.cs.Confirmed.Load())
	mustChange(t, ctx, r, model.Input{Kind: model.KindMkdir, Key: grp, Path: "b", Perm: 0o755})
	mustChange(t, ctx, r, model.Input{Kind: model.KindRename, Key: grp, Path: "a", Path2: "c"})
	require.ElementsMatch(t, []string{"b/", "c"}, must(t, ctx, r, workload.List(grp)).Names)
	require.True(t, r.C.Journal().Pending())

	kill()
	g.c.Net.ResetConns("k0")
	r.Killed()
	// The history has the confirmed create; the mkdir and rename are of
	// unknown outcome, the listing left out.
	require.EqualValues(t, 3, g.cs.Voided.Load())

	start := time.Now()
	require.NoError(t, g.w.Do(ctx, model.Input{Kind: model.KindReadDir, Key: grp}))
	took := time.Since(start)
	t.Logf("the listing waited %v for the dead reader's capability", took)
	require.GreaterOrEqual(t, took, lease/2, "the listing passed while the dead reader's capability should still stand")
	ops := g.rec.Operations()
	last := ops[len(ops)-1].Output.(model.Output)
	require.Equal(t, []string{"a"}, last.Names, "the dead reader's unsynced changes reached the cluster")
	g.check()
}

// TestBufferingCachers: random histories of 8 s with two buffering
// caching clients (two readers each, two operations in five changes, in
// bursts, one in twenty a sync) beside three plain clients whose reads
// and changes of the groups recall the buffering clients' exclusive
// capabilities, while the nemesis crashes the leader, kills (or closes) a
// buffering client, isolates the leader, freezes a buffering client and
// partitions the cluster, in that order. (The histories are longer than
// the other scenarios': the grants a buffering client loses to recalls
// are asked again only after a second, and the kill and the freeze leave
// a client idle for a while.) Some buffered change must have been
// committed and some answer confirmed, or the test checked nothing of
// buffering: a history that covered too little (on a starved machine the
// faults can leave a buffering client few changes that stand) is
// followed by another, up to three, each checked in full.
func TestBufferingCachers(t *testing.T) {
	sc := scenario{name: "BufferingCachers", clients: 3, cachers: 2, buffered: 2,
		script: []workload.Fault{workload.CrashLeader, workload.KillCacher, workload.IsolateLeader,
			workload.FreezeCacher, workload.PartitionHalves}}
	vs := []variant{{3, false}, {5, true}}
	if testing.Short() {
		vs = vs[:1]
	}
	for _, v := range vs {
		t.Run(v.String(), func(t *testing.T) {
			t.Parallel()
			var out workload.Outcome
			for attempt := 1; ; attempt++ {
				out = runScenario(t, sc, v, 8*time.Second, "")
				t.Logf("episodes: %s", strings.Join(out.Episodes, "; "))
				cs := out.Cache
				if attempt == 3 || cs.Committed.Load() > 0 && cs.Confirmed.Load() > 0 && cs.Recalls.Load() > 0 {
					break
				}
				t.Logf("history %d covered too little of buffering (%d buffered changes committed, %d answers confirmed, %d recalls): another",
					attempt, cs.Committed.Load(), cs.Confirmed.Load(), cs.Recalls.Load())
			}
			cs := out.Cache
			require.Positive(t, cs.Committed.Load(), "no buffered change was committed")
			require.Positive(t, cs.Confirmed.Load(), "no buffered answer was confirmed")
			require.Positive(t, cs.Recalls.Load(), "no capability was recalled")
		})
	}
}
