package workload

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/test/model"
)

// Buffering caching readers. A mount made with fsops.Options{Buffered:
// true} answers creates, mkdirs and renames in directories it holds
// exclusively at once and commits them later, in batches of its journal
// (client.Journal, docs/fuse.md "Buffered metadata"). What it answered
// is not yet what the cluster holds: a crash of the mount loses the
// journal's uncommitted suffix, and a batch the cluster refuses (a
// capability revoked while the mount was frozen, a name another session
// took) or whose outcome stays unknown is lost too. So an answer of a
// buffering client is only a claim until a later sync of its journal
// shows that nothing it may rest on was lost.
//
// The confirmer holds each answer of a buffering client (its readers'
// changes and reads alike: a read answered from the mount's state may
// show a change that is later lost) out of the history. A sync confirms
// every answer that returned before the sync began, when no operation of
// the journal was lost since the last check: those answers enter the
// history as they returned. When one was lost, every answer invoked
// before the loss was seen is voided: a change is recorded as of unknown
// outcome (it may or may not have taken effect, as for a timed-out
// command), and a read is left out. When the client is killed, every
// answer not yet confirmed is voided, and so is every one that returns
// afterwards.
//
// Why the check is sound: an operation appended to the journal before a
// sync began is committed or failed when the sync returns, and a failure
// is counted (Journal.Stats) before the journal counts the operation
// done. So an answer that returned before the sync began and whose
// operation was lost has its loss counted by the time the sync returns:
// either the count has grown since the last check (this check voids it),
// or the loss was already counted at the last check that saw a loss, and
// then the answer was invoked before that check and was voided by it.

// errLost is a sync that found operations of the journal lost; errEnded
// a sync of a client that was killed or finished.
var (
	errLost  = errors.New("workload: buffered operations were lost")
	errEnded = errors.New("workload: the buffering client has ended")
)

// confirmer settles the answers of one buffering client.
type confirmer struct {
	jr  *client.Journal
	rec *model.Recorder
	cs  *CacheStats

	mu     sync.Mutex
	held   []heldOp // guarded by mu: answered, not yet settled, in return order
	seq    uint64   // guarded by mu: answers held so far
	failed int64    // guarded by mu: the journal's lost operations at the last check that saw a loss
	taint  int64    // guarded by mu: answers invoked before this (recorder clock) are never confirmed
	dead   bool     // guarded by mu: killed or finished; every answer is voided
}

type heldOp struct {
	h   *model.Held
	seq uint64
}

func newConfirmer(jr *client.Journal, rec *model.Recorder, cs *CacheStats) *confirmer {
	return &confirmer{jr: jr, rec: rec, cs: cs}
}

// hold takes the answer of call, out, and keeps it until a sync settles it.
func (f *confirmer) hold(call *model.Call, out model.Output) {
	h := call.Hold(out)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dead || h.Invoked() < f.taint {
		f.void(h)
		return
	}
	f.seq++
	f.held = append(f.held, heldOp{h: h, seq: f.seq})
}

func (f *confirmer) void(h *model.Held) {
	h.Void()
	f.cs.Voided.Add(1)
}

// sync commits the journal and settles what it can: it confirms every
// answer held before it began when nothing was lost since the last check.
// It returns errLost when operations were lost (the answers invoked until
// now are voided), or the journal's error when it could not sync (the
// answers stay held).
func (f *confirmer) sync(ctx context.Context) error {
	f.mu.Lock()
	upto := f.seq
	f.mu.Unlock()
	f.cs.Syncs.Add(1)
	err := f.jr.Sync(ctx)
	_, _, failed := f.jr.Stats()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dead {
		return errEnded
	}
	if failed != f.failed {
		// Read after the count: every lost operation was appended, so
		// invoked, before this time.
		f.failed, f.taint = failed, f.rec.Now()
		for _, op := range f.held {
			f.void(op.h)
		}
		f.held = nil
		f.cs.FailedSyncs.Add(1)
		return errLost
	}
	if err != nil {
		// Not synced yet, nothing known lost: a later sync decides.
		f.cs.FailedSyncs.Add(1)
		return fmt.Errorf("sync journal: %w", err)
	}
	n := 0
	for n < len(f.held) && f.held[n].seq <= upto {
		if f.held[n].h.Invoked() < f.taint {
			f.void(f.held[n].h)
		} else {
			f.held[n].h.Confirm()
			f.cs.Confirmed.Add(1)
		}
		n++
	}
	f.held = f.held[n:]
	return nil
}

// kill voids every answer not confirmed, and every later one: the
// client's journal will never be committed (or whether it was is not
// known).
func (f *confirmer) kill() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dead {
		return
	}
	f.dead = true
	for _, op := range f.held {
		f.void(op.h)
	}
	f.held = nil
	batches, committed, failed := f.jr.Stats()
	f.cs.Batches.Add(batches)
	f.cs.Committed.Add(committed)
	f.cs.Lost.Add(failed)
}

// finish syncs a client whose readers have stopped, then voids whatever
// that sync could not confirm: after it the history holds every answer.
func (f *confirmer) finish(ctx context.Context) error {
	err := f.sync(ctx)
	f.kill()
	return err
}

// BufferStats count what the buffering clients of a run did.
type BufferStats struct {
	// Answered counts the changes a buffering client answered, done or
	// refused with an errno, without any call to the cluster (a lower
	// bound, as CacheStats.Local).
	Answered atomic.Int64
	// Syncs counts syncs of the journals (the readers' periodic ones,
	// before a graceful close, and at the end of the history), and
	// FailedSyncs those that found operations lost or could not finish.
	Syncs, FailedSyncs atomic.Int64
	// Confirmed and Voided count held answers that entered the history as
	// they returned, and those voided (changes of unknown outcome, reads
	// left out).
	Confirmed, Voided atomic.Int64
	// Batches, Committed and Lost sum the journals' counts
	// (client.Journal.Stats) when each client ended.
	Batches, Committed, Lost atomic.Int64
}

func (s *BufferStats) String() string {
	return fmt.Sprintf("buffering: %d changes answered locally, %d syncs (%d failed), %d answers confirmed, %d voided; journals: %d batches, %d operations committed, %d lost",
		s.Answered.Load(), s.Syncs.Load(), s.FailedSyncs.Load(), s.Confirmed.Load(), s.Voided.Load(),
		s.Batches.Load(), s.Committed.Load(), s.Lost.Load())
}
