// Package replace replaces a member of a running cluster by a new node
// without losing a quorum or failing a client's write.
// The `memfs node replace` command and the fault-injection tests both run
// it. It only talks to the cluster's admin API; it never touches a node's
// data directory and never removes a member before its successor votes.
//
// The order keeps a quorum at every step: the new node joins as a
// non-voter, which counts for no quorum while it catches up (pre-copy); it
// becomes a voter only once its state is close to the leader's, so the
// larger voter set can commit at once; only then does the old node leave.
// A leader asked to remove itself hands leadership over first (the
// server's removeMember).
package replace

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
)

// Target is the new node: ID@RAFT_ADDR,API_ADDR.
type Target struct {
	ID, RaftAddr, APIAddr string
}

func (t Target) String() string { return t.ID + "@" + t.RaftAddr + "," + t.APIAddr }

// ParseTarget reads ID@RAFT_ADDR,API_ADDR.
func ParseTarget(s string) (Target, error) {
	id, addrs, ok := strings.Cut(s, "@")
	raftAddr, apiAddr, ok2 := strings.Cut(addrs, ",")
	t := Target{ID: strings.TrimSpace(id), RaftAddr: strings.TrimSpace(raftAddr), APIAddr: strings.TrimSpace(apiAddr)}
	if !ok || !ok2 || t.ID == "" || t.RaftAddr == "" || t.APIAddr == "" || strings.Contains(t.APIAddr, ",") {
		return Target{}, fmt.Errorf("%q: want ID@RAFT_ADDR,API_ADDR, e.g. n4@10.0.0.4:7101,10.0.0.4:7001", s)
	}
	return t, nil
}

// Options are the knobs of one replacement. Old, New and Cluster are
// required; zero durations and MaxLag take the defaults below.
type Options struct {
	Old     string
	New     Target
	Cluster []string // API addresses of current members

	MaxLag         uint64        // entries the new node may trail the leader's commit index by (64)
	Stable         time.Duration // how long it must stay within MaxLag before promotion (2 s)
	CatchUpTimeout time.Duration // give up pre-copy after this long (10 min)
	StepTimeout    time.Duration // bound of each RPC and each membership step (30 s)
	Poll           time.Duration // progress interval (250 ms)

	Dialer   client.Dialer   // how to reach a node (default client.DialAddr)
	Security []client.Option // client.WithTLS and client.WithToken for the admin calls
	Progress func(Progress)  // called on every poll during the catch-up (optional)
	Note     func(string)    // called at each step (optional)
}

func (o *Options) net() Net { return Net{Dialer: o.Dialer, Security: o.Security} }

func (o *Options) defaults() {
	if o.MaxLag == 0 {
		o.MaxLag = 64
	}
	if o.Stable == 0 {
		o.Stable = 2 * time.Second
	}
	if o.CatchUpTimeout == 0 {
		o.CatchUpTimeout = 10 * time.Minute
	}
	if o.StepTimeout == 0 {
		o.StepTimeout = 30 * time.Second
	}
	if o.Poll == 0 {
		o.Poll = 250 * time.Millisecond
	}
	if o.Dialer == nil {
		o.Dialer = client.DialAddr
	}
	if o.Progress == nil {
		o.Progress = func(Progress) {}
	}
	if o.Note == nil {
		o.Note = func(string) {}
	}
}

// Progress is one look at the new node during the catch-up.
type Progress struct {
	Self    *pb.NodeStatus // the new node's report on itself
	Commit  uint64         // the leader's commit index
	Lag     uint64         // entries the new node trails it by
	Elapsed time.Duration  // since the catch-up began
}

// Summary is what a finished replacement reports.
type Summary struct {
	Old, New      string
	Elapsed       time.Duration
	CatchUp       time.Duration
	OldWasLeader  bool
	SyncBlocks    uint64 // blocks the new node fetched by block sync
	SyncBytes     uint64 // bytes it fetched by block sync
	RaftBytes     uint64 // bytes its Raft transport received (log entries and snapshots)
	Voters        []string
	NonVoters     []string
	Leader        string
	AppliedAtDone uint64
}

// Stage is how far a replacement got.
type Stage int

const (
	StageNothing  Stage = iota // membership unchanged
	StageAdded                 // new node is a non-voter
	StagePromoted              // new node votes, old node still a member
	StageRemoved               // old node gone
)

// Error is a failed replacement: the stage the membership is in now, and
// the cause. Its message says how to go on or undo.
type Error struct {
	Stage    Stage
	Old, New string
	Err      error
}

func (e *Error) Unwrap() error { return e.Err }

func (e *Error) Error() string {
	switch e.Stage {
	case StageNothing:
		return fmt.Sprintf("nothing changed: %v", e.Err)
	case StageAdded:
		return fmt.Sprintf("%s added as non-voter but not promoted: %v (run the same command again to resume, or \"memfs node remove %s\" to undo)",
			e.New, e.Err, e.New)
	case StagePromoted:
		return fmt.Sprintf("%s promoted to voter but %s not removed: %v (run \"memfs node remove %s\" to finish)",
			e.New, e.Old, e.Err, e.Old)
	}
	return fmt.Sprintf("%s replaced %s, but: %v", e.New, e.Old, e.Err)
}

// Run replaces opts.Old by opts.New. It can be run again after a failure:
// it resumes from the membership it finds. A failure is an *Error.
func Run(ctx context.Context, opts Options) (Summary, error) {
	opts.defaults()
	r := &replacer{opts: opts}
	return r.run(ctx)
}

// replacer runs one replacement.
type replacer struct {
	opts      Options
	leaderAPI string // cached leader API address for the lag probe
}

func (r *replacer) note(format string, args ...any) { r.opts.Note(fmt.Sprintf(format, args...)) }

func (r *replacer) run(ctx context.Context) (Summary, error) {
	o := r.opts
	start := time.Now()
	sum := Summary{Old: o.Old, New: o.New.ID}
	stage := StageNothing
	fail := func(err error) (Summary, error) { return sum, r.describeFailure(stage, err) }

	// Preflight: nothing changes until the plan can be carried through.
	st, err := r.clusterStatus(ctx)
	if err != nil {
		return fail(fmt.Errorf("read cluster status: %w", err))
	}
	if stage, err = r.preflight(ctx, st); err != nil {
		return fail(err)
	}
	sum.OldWasLeader = st.Leader == o.Old

	// 1. Add as a non-voter: it receives the log (or a snapshot) but counts
	// for no quorum.
	if stage < StageAdded {
		r.note("adding %s as a non-voter", o.New)
		if err := r.join(ctx, true); err != nil {
			return fail(fmt.Errorf("add %s as non-voter: %w", o.New.ID, err))
		}
		stage = StageAdded
	}

	// 2. Pre-copy: wait until it trails the leader by little, for a while.
	// Also when it votes already (started with --join, or a resumed run):
	// the old node leaves only once the new one holds the state.
	catchStart := time.Now()
	joinIndex, err := r.leaderCommit(ctx)
	if err != nil {
		return fail(fmt.Errorf("read the leader's commit index: %w", err))
	}
	if err := r.catchUp(ctx, joinIndex); err != nil {
		return fail(err)
	}
	sum.CatchUp = time.Since(catchStart)

	// 3. Promote. Recheck the quorum: a voter may have died meanwhile.
	if stage < StagePromoted {
		if err := r.promote(ctx); err != nil {
			return fail(err)
		}
		stage = StagePromoted
	}

	// 4. Remove the old node (a leader hands leadership over first) and
	// 5. verify: a leader among the new voters, old gone, new voting.
	final, oldLed, err := r.removeAndVerify(ctx, st)
	sum.OldWasLeader = sum.OldWasLeader || oldLed
	if err != nil {
		return fail(err)
	}
	r.summarize(ctx, final, &sum)
	sum.Elapsed = time.Since(start)
	return sum, nil
}

// removeAndVerify removes the old node and waits for the final
// configuration. A removal that a node reported done may still be undone:
// the configuration entry was appended but not committed when leadership
// moved. Then the old node is removed again, up to three times in all. st
// is the membership before, which names the old node's API address.
func (r *replacer) removeAndVerify(ctx context.Context, st *pb.StatusResponse) (*pb.StatusResponse, bool, error) {
	const attempts = 3
	var led bool
	for i := 1; ; i++ {
		l, err := r.removeOld(ctx)
		led = led || l
		if err != nil {
			return nil, led, err
		}
		r.forgetOld(st)
		final, err := r.waitFinal(ctx)
		if err == nil || !errors.Is(err, errStillMember) || i == attempts {
			return final, led, err
		}
		r.note("%s is a member again (its removal was not committed); removing it again", r.opts.Old)
	}
}

// errStillMember: the old node is in the configuration after its removal.
var errStillMember = errors.New("still in the configuration")

// stillMemberGrace is how long the leader may take to show a removal it
// answered for before it counts as undone.
const stillMemberGrace = 3 * time.Second

// preflight checks the plan against the membership st and says how far
// an earlier run got.
func (r *replacer) preflight(ctx context.Context, st *pb.StatusResponse) (Stage, error) {
	o := r.opts
	if FindNode(st, o.Old) == nil {
		return StageNothing, fmt.Errorf("%s is not a member (members: %s)", o.Old, strings.Join(memberIDs(st), ", "))
	}
	stage := StageNothing
	if cur := FindNode(st, o.New.ID); cur != nil {
		if cur.RaftAddr != o.New.RaftAddr {
			return stage, fmt.Errorf("%s is already a member with raft address %s, not %s", o.New.ID, cur.RaftAddr, o.New.RaftAddr)
		}
		stage = StageAdded
		if cur.Voter {
			stage = StagePromoted
		}
		r.note("%s is already a member (voter: %v); resuming", o.New.ID, cur.Voter)
	}
	self, err := r.newNodeReport(ctx)
	if err != nil {
		return stage, fmt.Errorf("new node %s unreachable at %s: %w (start it first: memfs server --id %s --data DIR --raft-addr %s --api-addr %s)",
			o.New.ID, o.New.APIAddr, err, o.New.ID, o.New.RaftAddr, o.New.APIAddr)
	}
	if self.Id != o.New.ID {
		return stage, fmt.Errorf("the node at %s is %q, not %q", o.New.APIAddr, self.Id, o.New.ID)
	}
	return stage, CheckQuorum(st, o.Old, o.New.ID)
}

func (r *replacer) promote(ctx context.Context) error {
	st, err := r.clusterStatus(ctx)
	if err != nil {
		return fmt.Errorf("read cluster status before promotion: %w", err)
	}
	if err := CheckQuorum(st, r.opts.Old, r.opts.New.ID); err != nil {
		return err
	}
	r.note("promoting %s to voter", r.opts.New.ID)
	if err := r.join(ctx, false); err != nil {
		return fmt.Errorf("promote %s: %w", r.opts.New.ID, err)
	}
	return nil
}

// removeOld removes the old node and reports whether it led just before.
func (r *replacer) removeOld(ctx context.Context) (bool, error) {
	o := r.opts
	st, err := r.clusterStatus(ctx)
	if err != nil {
		return false, fmt.Errorf("read cluster status before removal: %w", err)
	}
	led := st.Leader == o.Old
	if led {
		r.note("%s leads: it hands leadership over before its removal", o.Old)
	}
	r.note("removing %s", o.Old)
	if err := r.remove(ctx); err != nil {
		return led, fmt.Errorf("remove %s: %w", o.Old, err)
	}
	return led, nil
}

// forgetOld stops asking the removed node: it answers with the view of a
// node whose Raft has shut down (no leader), not the cluster's. The new
// node, a voter now, is asked instead. st is the membership before the
// removal, which names the old node's API address.
func (r *replacer) forgetOld(st *pb.StatusResponse) {
	var oldAPI string
	if old := FindNode(st, r.opts.Old); old != nil {
		oldAPI = old.ApiAddr
	}
	addrs := []string{r.opts.New.APIAddr}
	for _, a := range r.opts.Cluster {
		if a != oldAPI && a != r.opts.New.APIAddr {
			addrs = append(addrs, a)
		}
	}
	r.opts.Cluster = addrs
	if r.leaderAPI == oldAPI {
		r.leaderAPI = ""
	}
}

// summarize fills sum from the final membership and the new node's report.
func (r *replacer) summarize(ctx context.Context, st *pb.StatusResponse, sum *Summary) {
	sum.Leader = st.Leader
	for _, n := range st.Nodes {
		if n.Voter {
			sum.Voters = append(sum.Voters, n.Id)
		} else {
			sum.NonVoters = append(sum.NonVoters, n.Id)
		}
	}
	self, err := r.newNodeReport(ctx)
	if err != nil {
		return
	}
	sum.SyncBlocks, sum.SyncBytes = self.SyncBlocksFetchedTotal, self.SyncBytesFetchedTotal
	sum.RaftBytes, sum.AppliedAtDone = self.NetReceivedBytes, self.AppliedIndex
}

// catchUp polls the new node and the leader until the new node has applied
// at least joinIndex, is not restoring a snapshot, and trails the leader's
// commit index by at most MaxLag, continuously for Stable.
func (r *replacer) catchUp(ctx context.Context, joinIndex uint64) error {
	o := r.opts
	ctx, cancel := context.WithTimeout(ctx, o.CatchUpTimeout)
	defer cancel()
	start := time.Now()
	var stableSince, unreachableSince time.Time
	var last *Progress
	tick := time.NewTicker(o.Poll)
	defer tick.Stop()
	for {
		commit, lerr := r.leaderCommit(ctx)
		self, nerr := r.newNodeStatus(ctx)
		switch {
		case nerr != nil:
			if unreachableSince.IsZero() {
				unreachableSince = time.Now()
			}
			if time.Since(unreachableSince) >= o.StepTimeout {
				return fmt.Errorf("new node %s unreachable at %s for %v: %w", o.New.ID, o.New.APIAddr, o.StepTimeout, nerr)
			}
			stableSince = time.Time{}
		case lerr != nil:
			unreachableSince = time.Time{}
			stableSince = time.Time{} // no leader: cannot tell the lag
		default:
			unreachableSince = time.Time{}
			p := Progress{Self: self, Commit: commit, Lag: commit - min(commit, self.AppliedIndex), Elapsed: time.Since(start)}
			last = &p
			o.Progress(p)
			if !r.closeEnough(p, joinIndex) {
				stableSince = time.Time{}
			} else if stableSince.IsZero() {
				stableSince = time.Now()
			} else if time.Since(stableSince) >= o.Stable {
				r.note("%s caught up: applied %d, %d behind the leader", o.New.ID, self.AppliedIndex, p.Lag)
				return nil
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return r.catchUpFailed(ctx, last)
		}
	}
}

func (r *replacer) closeEnough(p Progress, joinIndex uint64) bool {
	return p.Self.AppliedIndex >= joinIndex && !p.Self.Restoring && p.Lag <= r.opts.MaxLag
}

func (r *replacer) catchUpFailed(ctx context.Context, last *Progress) error {
	o := r.opts
	if errors.Is(context.Cause(ctx), context.Canceled) {
		return fmt.Errorf("interrupted while %s was catching up", o.New.ID)
	}
	state := "no progress report"
	if last != nil {
		state = fmt.Sprintf("applied %d, %d entries behind the leader, restoring %v", last.Self.AppliedIndex, last.Lag, last.Self.Restoring)
	}
	return fmt.Errorf("%s did not catch up within %v (%s); is its raft address %s reachable from the leader?",
		o.New.ID, o.CatchUpTimeout, state, o.New.RaftAddr)
}

// describeFailure reads the membership once more (the failed step may
// have taken effect after all) and says where the replacement stopped.
func (r *replacer) describeFailure(stage Stage, err error) error {
	o := r.opts
	ctx, cancel := context.WithTimeout(context.Background(), min(o.StepTimeout, 10*time.Second))
	defer cancel()
	if st, serr := r.clusterStatus(ctx); serr == nil {
		switch n, old := FindNode(st, o.New.ID), FindNode(st, o.Old); {
		case n == nil:
			stage = StageNothing
		case !n.Voter:
			stage = StageAdded
		case old != nil:
			stage = StagePromoted
		default:
			stage = StageRemoved
		}
	}
	return &Error{Stage: stage, Old: o.Old, New: o.New.ID, Err: err}
}

// CheckQuorum refuses a plan that would leave the cluster without a
// working majority: after promotion (voters+1, with the new node alive)
// and after removal of the old node.
func CheckQuorum(st *pb.StatusResponse, oldID, newID string) error {
	voters, alive := 0, 0
	oldAlive := false
	var down []string
	for _, n := range st.Nodes {
		if !n.Voter || n.Id == newID {
			continue // the new node is counted below, alive: it must be to vote
		}
		voters++
		if n.Error == "" && n.State != "" {
			alive++
			oldAlive = oldAlive || n.Id == oldID
		} else {
			down = append(down, n.Id)
		}
	}
	voters, alive = voters+1, alive+1 // the new node, as a voter
	if alive < voters/2+1 {
		return fmt.Errorf("promoting %s would leave %d of %d voters reachable, below a majority (down: %s)",
			newID, alive, voters, strings.Join(down, ", "))
	}
	if oldAlive {
		alive--
	}
	if alive < (voters-1)/2+1 {
		return fmt.Errorf("removing %s would leave %d of %d voters reachable, below a majority (down: %s)",
			oldID, alive, voters-1, strings.Join(down, ", "))
	}
	return nil
}

// join adds (nonvoter) or promotes the new node, retrying while there is
// no leader.
func (r *replacer) join(ctx context.Context, nonvoter bool) error {
	o := r.opts
	req := &pb.JoinRequest{Version: pb.Version, Id: o.New.ID, RaftAddr: o.New.RaftAddr, ApiAddr: o.New.APIAddr, Nonvoter: nonvoter}
	return r.retry(ctx, func(ctx context.Context) error {
		return r.call(ctx, r.opts.StepTimeout/3, func(ctx context.Context, c pb.MemFSClient) error {
			_, err := c.Join(ctx, req)
			return err
		})
	}, func() (bool, error) {
		// Done already if the node is there with the asked suffrage.
		st, err := r.clusterStatus(ctx)
		if err != nil {
			return false, err
		}
		n := FindNode(st, o.New.ID)
		return n != nil && (n.Voter || nonvoter), nil
	})
}

// remove removes the old node; NOT_FOUND after an attempt whose answer was
// lost means it is gone already.
func (r *replacer) remove(ctx context.Context) error {
	req := &pb.RemoveNodeRequest{Version: pb.Version, Id: r.opts.Old}
	return r.retry(ctx, func(ctx context.Context) error {
		err := r.call(ctx, r.opts.StepTimeout/3, func(ctx context.Context, c pb.MemFSClient) error {
			_, err := c.RemoveNode(ctx, req)
			return err
		})
		if status.Code(err) == codes.NotFound {
			return nil
		}
		return err
	}, func() (bool, error) {
		st, err := r.clusterStatus(ctx)
		if err != nil {
			return false, err
		}
		return FindNode(st, r.opts.Old) == nil, nil
	})
}

// retry runs step until it succeeds or done reports the goal reached, for
// at most StepTimeout; errors that are not about availability end it.
func (r *replacer) retry(ctx context.Context, step func(context.Context) error, done func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, r.opts.StepTimeout)
	defer cancel()
	backoff := 100 * time.Millisecond
	for {
		err := step(ctx)
		if err == nil {
			return nil
		}
		if ok, derr := done(); derr == nil && ok {
			return nil
		}
		if !retryable(err) {
			return err
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return fmt.Errorf("%w (after %v of retries)", err, r.opts.StepTimeout)
		}
		backoff = min(2*backoff, time.Second)
	}
}

func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		return true
	}
	return errors.Is(err, errNoAnswer)
}

// waitFinal polls until a leader other than the old node is known and the
// configuration has the new node voting and no old node. An old node that
// stays in the configuration for stillMemberGrace ends the wait early.
func (r *replacer) waitFinal(ctx context.Context) (*pb.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.StepTimeout)
	defer cancel()
	var last error
	var stillSince time.Time
	for {
		st, err := r.clusterStatus(ctx)
		if err == nil {
			n := FindNode(st, r.opts.Old)
			if n == nil {
				stillSince = time.Time{}
			} else if stillSince.IsZero() {
				stillSince = time.Now()
			}
			n = FindNode(st, r.opts.New.ID)
			switch {
			case !stillSince.IsZero() && time.Since(stillSince) >= stillMemberGrace:
				return nil, fmt.Errorf("%s %w", r.opts.Old, errStillMember)
			case !stillSince.IsZero():
				err = fmt.Errorf("%s %w", r.opts.Old, errStillMember)
			case n == nil || !n.Voter:
				err = fmt.Errorf("%s is not a voter", r.opts.New.ID)
			case st.Leader == "" || st.Leader == r.opts.Old:
				err = errors.New("no leader among the new voters yet")
			default:
				return st, nil
			}
		}
		last = err
		select {
		case <-time.After(r.opts.Poll):
		case <-ctx.Done():
			return nil, fmt.Errorf("final configuration not confirmed within %v: %w", r.opts.StepTimeout, last)
		}
	}
}

func memberIDs(st *pb.StatusResponse) []string {
	var ids []string
	for _, n := range st.Nodes {
		ids = append(ids, n.Id)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}
