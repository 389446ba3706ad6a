package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/memoryfs/memfs/proto"
)

// Live node replacement (issue 8, part 4). The order keeps a quorum at
// every step: the new node joins as a non-voter, which counts for no
// quorum while it catches up (pre-copy); it becomes a voter only once its
// state is close to the leader's, so the larger voter set can commit at
// once; only then does the old node leave. A leader asked to remove itself
// hands leadership over first (server.removeMember).

// replaceTarget is the node of --with ID@RAFT_ADDR,API_ADDR.
type replaceTarget struct {
	ID, RaftAddr, APIAddr string
}

func (t replaceTarget) String() string { return t.ID + "@" + t.RaftAddr + "," + t.APIAddr }

// parseReplaceTarget reads ID@RAFT_ADDR,API_ADDR.
func parseReplaceTarget(s string) (replaceTarget, error) {
	id, addrs, ok := strings.Cut(s, "@")
	raftAddr, apiAddr, ok2 := strings.Cut(addrs, ",")
	t := replaceTarget{ID: strings.TrimSpace(id), RaftAddr: strings.TrimSpace(raftAddr), APIAddr: strings.TrimSpace(apiAddr)}
	if !ok || !ok2 || t.ID == "" || t.RaftAddr == "" || t.APIAddr == "" || strings.Contains(t.APIAddr, ",") {
		return replaceTarget{}, fmt.Errorf("--with %q: want ID@RAFT_ADDR,API_ADDR, e.g. n4@10.0.0.4:7101,10.0.0.4:7001", s)
	}
	return t, nil
}

// replaceOptions are the knobs of one replacement.
type replaceOptions struct {
	Old     string
	New     replaceTarget
	Cluster []string // API addresses of current members

	MaxLag         uint64        // entries the new node may trail the leader's commit index by
	Stable         time.Duration // how long it must stay within MaxLag before promotion
	CatchUpTimeout time.Duration // give up pre-copy after this long
	StepTimeout    time.Duration // bound of each RPC and each membership step
	Poll           time.Duration // progress refresh interval
}

// replaceSummary is what a finished replacement reports.
type replaceSummary struct {
	Old, New      string
	Elapsed       time.Duration
	CatchUp       time.Duration
	OldWasLeader  bool
	SyncBlocks    uint64 // blocks the new node fetched by block sync (0 before it exists)
	SyncBytes     uint64 // bytes it fetched by block sync
	RaftBytes     uint64 // bytes its Raft transport received (log entries and snapshots)
	Voters        []string
	NonVoters     []string
	Leader        string
	AppliedAtDone uint64
}

func (s replaceSummary) print(w io.Writer) {
	fmt.Fprintf(w, "replaced %s with %s in %.1fs (catch-up %.1fs)\n", s.Old, s.New,
		s.Elapsed.Seconds(), s.CatchUp.Seconds())
	fetched := fmt.Sprintf("%s received over Raft", humanBytes(s.RaftBytes))
	if s.SyncBytes > 0 {
		fetched = fmt.Sprintf("%s in %d blocks fetched by block sync, %s", humanBytes(s.SyncBytes), s.SyncBlocks, fetched)
	}
	fmt.Fprintf(w, "  %s: %s\n", s.New, fetched)
	fmt.Fprintf(w, "  voters: %s; leader: %s", strings.Join(s.Voters, ", "), s.Leader)
	if s.OldWasLeader {
		fmt.Fprintf(w, " (%s led before)", s.Old)
	}
	fmt.Fprintln(w)
	if len(s.NonVoters) > 0 {
		fmt.Fprintf(w, "  non-voters: %s\n", strings.Join(s.NonVoters, ", "))
	}
	fmt.Fprintf(w, "  %s is no longer a member: stop its process and keep or delete its data dir\n", s.Old)
}

// replaceStage is how far a replacement got, for the error message.
type replaceStage int

const (
	stageNothing  replaceStage = iota // membership unchanged
	stageAdded                        // new node is a non-voter
	stagePromoted                     // new node votes, old node still a member
	stageRemoved                      // old node gone
)

// replacer runs one replacement.
type replacer struct {
	opts     replaceOptions
	progress io.Writer // the refreshed progress line and step notes (stderr)
	tty      bool      // progress may overwrite its line
	now      func() time.Time

	leaderAPI string // cached leader API address for the lag probe
	lastLine  time.Time
	lineOpen  bool
}

func newReplacer(opts replaceOptions, progress io.Writer) *replacer {
	if opts.MaxLag == 0 {
		opts.MaxLag = 64
	}
	if opts.Stable == 0 {
		opts.Stable = 2 * time.Second
	}
	if opts.CatchUpTimeout == 0 {
		opts.CatchUpTimeout = 10 * time.Minute
	}
	if opts.StepTimeout == 0 {
		opts.StepTimeout = 30 * time.Second
	}
	if opts.Poll == 0 {
		opts.Poll = 250 * time.Millisecond
	}
	r := &replacer{opts: opts, progress: progress, now: time.Now}
	if f, ok := progress.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			r.tty = true
		}
	}
	return r
}

// run replaces opts.Old by opts.New. On failure the error says what the
// membership is now and how to go on or undo.
func (r *replacer) run(ctx context.Context) (replaceSummary, error) {
	o := r.opts
	start := r.now()
	sum := replaceSummary{Old: o.Old, New: o.New.ID}
	stage := stageNothing
	fail := func(err error) (replaceSummary, error) {
		r.endLine()
		return sum, r.describeFailure(stage, err)
	}

	// Preflight: nothing changes until the plan can be carried through.
	st, err := r.clusterStatus(ctx)
	if err != nil {
		return fail(fmt.Errorf("read cluster status: %w", err))
	}
	old := findNode(st, o.Old)
	if old == nil {
		return fail(fmt.Errorf("%s is not a member (members: %s)", o.Old, strings.Join(memberIDs(st), ", ")))
	}
	if cur := findNode(st, o.New.ID); cur != nil {
		if cur.RaftAddr != o.New.RaftAddr {
			return fail(fmt.Errorf("%s is already a member with raft address %s, not %s", o.New.ID, cur.RaftAddr, o.New.RaftAddr))
		}
		stage = stageAdded
		if cur.Voter {
			stage = stagePromoted
		}
		r.note("%s is already a member (voter: %v); resuming", o.New.ID, cur.Voter)
	}
	self, err := r.newNodeStatus(ctx)
	if err != nil {
		return fail(fmt.Errorf("new node %s unreachable at %s: %w (start it first: memfs server --id %s --data DIR --raft-addr %s --api-addr %s)",
			o.New.ID, o.New.APIAddr, err, o.New.ID, o.New.RaftAddr, o.New.APIAddr))
	}
	if self.Id != o.New.ID {
		return fail(fmt.Errorf("the node at %s is %q, not %q", o.New.APIAddr, self.Id, o.New.ID))
	}
	if err := checkQuorum(st, o.Old, o.New.ID); err != nil {
		return fail(err)
	}
	sum.OldWasLeader = st.Leader == o.Old

	// 1. Add as a non-voter: it receives the log (or a snapshot) but counts
	// for no quorum.
	if stage < stageAdded {
		r.note("adding %s as a non-voter", o.New)
		if err := r.join(ctx, true); err != nil {
			return fail(fmt.Errorf("add %s as non-voter: %w", o.New.ID, err))
		}
		stage = stageAdded
	}

	// 2. Pre-copy: wait until it trails the leader by little, for a while.
	// Also when it votes already (started with --join, or a resumed run):
	// the old node leaves only once the new one holds the state.
	catchStart := r.now()
	joinIndex, err := r.leaderCommit(ctx)
	if err != nil {
		return fail(fmt.Errorf("read the leader's commit index: %w", err))
	}
	if err := r.catchUp(ctx, joinIndex); err != nil {
		return fail(err)
	}
	sum.CatchUp = r.now().Sub(catchStart)

	// 3. Promote. Recheck the quorum: a voter may have died meanwhile.
	if stage < stagePromoted {
		st, err := r.clusterStatus(ctx)
		if err != nil {
			return fail(fmt.Errorf("read cluster status before promotion: %w", err))
		}
		if err := checkQuorum(st, o.Old, o.New.ID); err != nil {
			return fail(err)
		}
		r.note("promoting %s to voter", o.New.ID)
		if err := r.join(ctx, false); err != nil {
			return fail(fmt.Errorf("promote %s: %w", o.New.ID, err))
		}
		stage = stagePromoted
	}

	// 4. Remove the old node; a leader hands leadership over first.
	st, err = r.clusterStatus(ctx)
	if err != nil {
		return fail(fmt.Errorf("read cluster status before removal: %w", err))
	}
	if st.Leader == o.Old {
		sum.OldWasLeader = true
		r.note("%s leads: it hands leadership over before its removal", o.Old)
	}
	r.note("removing %s", o.Old)
	if err := r.remove(ctx); err != nil {
		return fail(fmt.Errorf("remove %s: %w", o.Old, err))
	}
	stage = stageRemoved

	// 5. Verify: a leader among the new voters, old gone, new voting.
	st, err = r.waitFinal(ctx)
	if err != nil {
		return fail(err)
	}
	sum.Leader = st.Leader
	for _, n := range st.Nodes {
		if n.Voter {
			sum.Voters = append(sum.Voters, n.Id)
		} else {
			sum.NonVoters = append(sum.NonVoters, n.Id)
		}
	}
	if self, err := r.newNodeStatus(ctx); err == nil {
		sum.SyncBlocks, sum.SyncBytes = self.SyncBlocksFetched, self.SyncBytesFetchedTotal
		if sum.SyncBytes == 0 {
			sum.SyncBytes = self.SyncBytesFetched
		}
		sum.RaftBytes, sum.AppliedAtDone = self.NetReceivedBytes, self.AppliedIndex
	}
	sum.Elapsed = r.now().Sub(start)
	return sum, nil
}

// catchUp polls the new node and the leader until the new node has applied
// at least joinIndex, is not restoring a snapshot, and trails the leader's
// commit index by at most MaxLag, continuously for Stable.
func (r *replacer) catchUp(ctx context.Context, joinIndex uint64) error {
	o := r.opts
	ctx, cancel := context.WithTimeout(ctx, o.CatchUpTimeout)
	defer cancel()
	start := r.now()
	var stableSince, unreachableSince time.Time
	var last *pb.NodeStatus
	var lastLag uint64
	tick := time.NewTicker(o.Poll)
	defer tick.Stop()
	for {
		commit, lerr := r.leaderCommit(ctx)
		self, nerr := r.newNodeStatus(ctx)
		switch {
		case nerr != nil:
			if unreachableSince.IsZero() {
				unreachableSince = r.now()
			}
			if r.now().Sub(unreachableSince) >= o.StepTimeout {
				return fmt.Errorf("new node %s unreachable at %s for %v: %w", o.New.ID, o.New.APIAddr, o.StepTimeout, nerr)
			}
			stableSince = time.Time{}
		case lerr != nil:
			unreachableSince = time.Time{}
			stableSince = time.Time{} // no leader: cannot tell the lag
		default:
			unreachableSince = time.Time{}
			lag := commit - min(commit, self.AppliedIndex)
			last, lastLag = self, lag
			r.showProgress(self, commit, lag, r.now().Sub(start))
			if self.AppliedIndex >= joinIndex && !self.Restoring && lag <= o.MaxLag {
				if stableSince.IsZero() {
					stableSince = r.now()
				}
				if r.now().Sub(stableSince) >= o.Stable {
					r.endLine()
					r.note("%s caught up: applied %d, %d behind the leader", o.New.ID, self.AppliedIndex, lag)
					return nil
				}
			} else {
				stableSince = time.Time{}
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			if parentDone(ctx) {
				return fmt.Errorf("interrupted while %s was catching up", o.New.ID)
			}
			state := "no progress report"
			if last != nil {
				state = fmt.Sprintf("applied %d, %d entries behind the leader, restoring %v", last.AppliedIndex, lastLag, last.Restoring)
			}
			return fmt.Errorf("%s did not catch up within %v (%s); is its raft address %s reachable from the leader?",
				o.New.ID, o.CatchUpTimeout, state, o.New.RaftAddr)
		}
	}
}

// parentDone tells an interrupt (the command's context) from the
// catch-up deadline.
func parentDone(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), context.Canceled)
}

// showProgress draws the progress line: log position and lag, and block
// sync counts once the node reports them.
func (r *replacer) showProgress(self *pb.NodeStatus, commit, lag uint64, elapsed time.Duration) {
	now := r.now()
	if !r.tty && now.Sub(r.lastLine) < 2*time.Second {
		return // a log file gets a line every 2 s, not a flood
	}
	r.lastLine = now
	var b strings.Builder
	fmt.Fprintf(&b, "%s catching up: log %d/%d (lag %d)", r.opts.New.ID, self.AppliedIndex, commit, lag)
	if self.SyncBlocksWanted > 0 || self.SyncBytesWanted > 0 {
		fmt.Fprintf(&b, ", blocks %d/%d, %s/%s %s", self.SyncBlocksFetched, self.SyncBlocksWanted,
			humanBytes(self.SyncBytesFetched), humanBytes(self.SyncBytesWanted),
			bar(self.SyncBytesFetched, self.SyncBytesWanted, 20))
	}
	if self.Restoring {
		b.WriteString(", restoring snapshot")
	}
	fmt.Fprintf(&b, ", %s received, %.0fs", humanBytes(self.NetReceivedBytes), elapsed.Seconds())
	if r.tty {
		fmt.Fprintf(r.progress, "\r\033[K%s", b.String())
		r.lineOpen = true
		return
	}
	fmt.Fprintln(r.progress, b.String())
}

// bar draws done/total as a bar of width cells.
func bar(done, total uint64, width int) string {
	if total == 0 {
		return ""
	}
	full := int(min(done, total) * uint64(width) / total)
	return "[" + strings.Repeat("#", full) + strings.Repeat(".", width-full) + "]"
}

// endLine ends an open progress line so the next message starts clean.
func (r *replacer) endLine() {
	if r.lineOpen {
		fmt.Fprintln(r.progress)
		r.lineOpen = false
	}
}

func (r *replacer) note(format string, args ...any) {
	r.endLine()
	fmt.Fprintf(r.progress, format+"\n", args...)
}

// describeFailure reads the membership once more (the failed step may
// have taken effect after all) and says where the replacement stopped.
func (r *replacer) describeFailure(stage replaceStage, err error) error {
	o := r.opts
	ctx, cancel := context.WithTimeout(context.Background(), min(o.StepTimeout, 10*time.Second))
	defer cancel()
	if st, serr := r.clusterStatus(ctx); serr == nil {
		switch n, old := findNode(st, o.New.ID), findNode(st, o.Old); {
		case n == nil:
			stage = stageNothing
		case !n.Voter:
			stage = stageAdded
		case old != nil:
			stage = stagePromoted
		default:
			stage = stageRemoved
		}
	}
	return explainedError{stageError(stage, o, err)}
}

func stageError(stage replaceStage, o replaceOptions, err error) error {
	switch stage {
	case stageNothing:
		return fmt.Errorf("nothing changed: %w", err)
	case stageAdded:
		return fmt.Errorf("%s added as non-voter but not promoted: %w (run the same command again to resume, or \"memfs node remove %s\" to undo)",
			o.New.ID, err, o.New.ID)
	case stagePromoted:
		return fmt.Errorf("%s promoted to voter but %s not removed: %w (run \"memfs node remove %s\" to finish)",
			o.New.ID, o.Old, err, o.Old)
	}
	return fmt.Errorf("%s replaced %s, but: %w", o.New.ID, o.Old, err)
}

// checkQuorum refuses a plan that would leave the cluster without a
// working majority: after promotion (voters+1, with the new node alive)
// and after removal of the old node.
func checkQuorum(st *pb.StatusResponse, oldID, newID string) error {
	voters, alive := 0, 0
	oldAlive := false
	var down []string
	for _, n := range st.Nodes {
		if !n.Voter {
			continue
		}
		if n.Id == newID {
			continue // counted below, alive or not: it must be to vote
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
		return r.call(ctx, func(ctx context.Context, c pb.MemFSClient) error {
			_, err := c.Join(ctx, req)
			return err
		})
	}, func() (bool, error) {
		// Done already if the node is there with the asked suffrage.
		st, err := r.clusterStatus(ctx)
		if err != nil {
			return false, err
		}
		n := findNode(st, o.New.ID)
		return n != nil && (n.Voter || nonvoter), nil
	})
}

// remove removes the old node; NOT_FOUND after an attempt whose answer was
// lost means it is gone already.
func (r *replacer) remove(ctx context.Context) error {
	req := &pb.RemoveNodeRequest{Version: pb.Version, Id: r.opts.Old}
	return r.retry(ctx, func(ctx context.Context) error {
		err := r.call(ctx, func(ctx context.Context, c pb.MemFSClient) error {
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
		return findNode(st, r.opts.Old) == nil, nil
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
	return strings.HasPrefix(err.Error(), "no node answered")
}

// waitFinal polls until a leader other than the old node is known and the
// configuration has the new node voting and no old node.
func (r *replacer) waitFinal(ctx context.Context) (*pb.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.StepTimeout)
	defer cancel()
	var last error
	for {
		st, err := r.clusterStatus(ctx)
		if err == nil {
			n := findNode(st, r.opts.New.ID)
			switch {
			case findNode(st, r.opts.Old) != nil:
				err = fmt.Errorf("%s still in the configuration", r.opts.Old)
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

// call runs fn against the cluster members in turn (not the new node: it
// may not know the leader yet). Each attempt is bounded by StepTimeout.
func (r *replacer) call(ctx context.Context, fn func(context.Context, pb.MemFSClient) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.opts.StepTimeout)
	defer cancel()
	return callAddrs(ctx, r.opts.Cluster, fn)
}

// clusterStatus is the leader's view of the membership, with each node's
// own report.
func (r *replacer) clusterStatus(ctx context.Context) (*pb.StatusResponse, error) {
	var st *pb.StatusResponse
	err := r.call(ctx, func(ctx context.Context, c pb.MemFSClient) error {
		var err error
		st, err = c.Status(ctx, &pb.StatusRequest{Version: pb.Version})
		return err
	})
	if err == nil {
		r.leaderAPI = st.LeaderApiAddr
	}
	return st, err
}

// newNodeStatus is the new node's report on itself, asked directly (a
// leader's view of a peer lacks the sync fields and costs a round trip
// more).
func (r *replacer) newNodeStatus(ctx context.Context) (*pb.NodeStatus, error) {
	return localStatus(ctx, r.opts.New.APIAddr, r.opts.StepTimeout)
}

// leaderCommit is the leader's commit index, asked of the leader itself.
func (r *replacer) leaderCommit(ctx context.Context) (uint64, error) {
	for attempt := 0; attempt < 2; attempt++ {
		if r.leaderAPI == "" || attempt > 0 {
			if _, err := r.clusterStatus(ctx); err != nil {
				return 0, err
			}
			if r.leaderAPI == "" {
				return 0, errors.New("no leader")
			}
		}
		self, err := localStatus(ctx, r.leaderAPI, r.opts.StepTimeout)
		if err == nil && self.State == "Leader" {
			return self.CommitIndex, nil
		}
	}
	return 0, errors.New("leader changed while asked")
}

// localStatus asks one node for its own status.
func localStatus(ctx context.Context, addr string, timeout time.Duration) (*pb.NodeStatus, error) {
	conn, err := adminDial(addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, min(timeout, 5*time.Second))
	defer cancel()
	resp, err := pb.NewMemFSClient(conn).Status(ctx, &pb.StatusRequest{Version: pb.Version, Local: true})
	if err != nil {
		return nil, err
	}
	if resp.Self == nil {
		return nil, fmt.Errorf("node at %s did not describe itself", addr)
	}
	return resp.Self, nil
}

func findNode(st *pb.StatusResponse, id string) *pb.NodeStatus {
	for _, n := range st.Nodes {
		if n.Id == id {
			return n
		}
	}
	return nil
}

func memberIDs(st *pb.StatusResponse) []string {
	var ids []string
	for _, n := range st.Nodes {
		ids = append(ids, n.Id)
	}
	sort.Strings(ids)
	return slices.Compact(ids)
}
