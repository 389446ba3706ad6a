package server

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// verifier confirms leadership for linearizable reads, sharing one
// VerifyLeader round among every read that arrived before the round began.
// A round that started before a read arrived proves nothing about it, so
// such a read waits for the next round.
type verifier struct {
	raft *raft.Raft

	mu      sync.Mutex
	running bool         // guarded by mu
	waiting []chan error // reads for the next round; guarded by mu
}

func (v *verifier) verify(ctx context.Context) error {
	ch := make(chan error, 1)
	v.mu.Lock()
	v.waiting = append(v.waiting, ch)
	if !v.running {
		v.running = true
		go v.rounds()
	}
	v.mu.Unlock()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (v *verifier) rounds() {
	for {
		v.mu.Lock()
		group := v.waiting
		v.waiting = nil
		if len(group) == 0 {
			v.running = false
			v.mu.Unlock()
			return
		}
		v.mu.Unlock()
		err := verifyLeader(v.raft)
		for _, ch := range group {
			ch <- err
		}
	}
}

// verifyLeader runs one VerifyLeader round. Like an Apply future (see
// futureError), a verify future still queued when Raft shuts down is never
// answered, and rounds would then keep the raft.Raft alive forever; the
// verifier has no stop channel, so it polls Raft's state while it waits.
func verifyLeader(r *raft.Raft) error {
	f := r.VerifyLeader()
	errc := make(chan error, 1)
	go func() { errc <- f.Error() }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-errc:
			return err
		case <-tick.C:
			if r.State() != raft.Shutdown {
				continue
			}
			select {
			case err := <-errc:
				return err
			default:
				return raft.ErrRaftShutdown
			}
		}
	}
}

// leaderReady tracks whether this leader has applied an entry of its own
// term. Until it has, its commit index may lag entries an earlier leader
// committed, so it cannot serve a linearizable read.
type leaderReady struct {
	mu    sync.Mutex
	term  uint64        // term in which the ready entry applied; guarded by mu
	index uint64        // index of that entry; guarded by mu
	ch    chan struct{} // closed when term/index change; guarded by mu
}

func newLeaderReady() *leaderReady { return &leaderReady{ch: make(chan struct{})} }

func (l *leaderReady) set(term, index uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if term < l.term {
		return
	}
	l.term, l.index = term, index
	close(l.ch)
	l.ch = make(chan struct{})
}

// wait returns the ready entry's index once the leader is ready in term.
func (l *leaderReady) wait(ctx context.Context, term uint64) (uint64, error) {
	for {
		l.mu.Lock()
		t, idx, ch := l.term, l.index, l.ch
		l.mu.Unlock()
		if t == term {
			return idx, nil
		}
		if t > term {
			return 0, raft.ErrLeadershipLost
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// readyIn reports whether the leader is ready in term.
func (l *leaderReady) readyIn(term uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.term == term
}
