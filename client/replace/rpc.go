package replace

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
)

// errNoAnswer: every address was unavailable.
var errNoAnswer = errors.New("no node answered")

// Net is how admin connections reach nodes.
type Net struct {
	Dialer   client.Dialer   // nil: client.DialAddr
	Security []client.Option // client.WithTLS, client.WithToken
}

// Dial opens an admin connection to addr ("host:port" or "unix:///path").
func Dial(addr string, n Net) (*grpc.ClientConn, error) {
	dial := n.Dialer
	if dial == nil {
		dial = client.DialAddr
	}
	authority := addr
	if strings.HasPrefix(addr, "/") {
		addr = "unix://" + addr
	}
	if strings.HasPrefix(addr, "unix:") {
		authority = "localhost"
	}
	return grpc.NewClient("passthrough:///"+addr, append(client.DialOptions(n.Security...),
		grpc.WithAuthority(authority),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return dial(ctx, addr) }))...)
}

// CallAddrs runs fn against addrs in turn until one answers with anything
// but UNAVAILABLE (or DEADLINE_EXCEEDED while ctx itself has time left: fn
// may bound each attempt). When none does, the error lists each address's
// reason.
func CallAddrs(ctx context.Context, dial Net, addrs []string, fn func(context.Context, pb.MemFSClient) error) error {
	var errs []error
	for _, addr := range addrs {
		conn, err := Dial(addr, dial)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		err = fn(ctx, pb.NewMemFSClient(conn))
		_ = conn.Close()
		switch code := status.Code(err); {
		case code == codes.Unavailable:
		case code == codes.DeadlineExceeded && ctx.Err() == nil:
		default:
			return err
		}
		errs = append(errs, fmt.Errorf("%s: %s", addr, status.Convert(err).Message()))
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("%w: %w", errNoAnswer, errors.Join(errs...))
}

// LocalStatus asks the node at addr for its own status.
func LocalStatus(ctx context.Context, dial Net, addr string) (*pb.NodeStatus, error) {
	conn, err := Dial(addr, dial)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := pb.NewMemFSClient(conn).Status(ctx, &pb.StatusRequest{Version: pb.Version, Local: true})
	if err != nil {
		return nil, err
	}
	if resp.Self == nil {
		return nil, fmt.Errorf("node at %s did not describe itself", addr)
	}
	return resp.Self, nil
}

// FindNode returns the member id of st, or nil.
func FindNode(st *pb.StatusResponse, id string) *pb.NodeStatus {
	for _, n := range st.Nodes {
		if n.Id == id {
			return n
		}
	}
	return nil
}

// call runs fn against the cluster members in turn (not the new node: it
// may not know the leader yet), each attempt bounded by per, all of them
// by StepTimeout.
func (r *replacer) call(ctx context.Context, per time.Duration, fn func(context.Context, pb.MemFSClient) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.opts.StepTimeout)
	defer cancel()
	return CallAddrs(ctx, r.opts.net(), r.opts.Cluster, func(ctx context.Context, c pb.MemFSClient) error {
		ctx, cancel := context.WithTimeout(ctx, per)
		defer cancel()
		return fn(ctx, c)
	})
}

// statusAttempt bounds one Status call: a node asks its peers for at most
// a second each (server.peerStatusTimeout), so a call that takes longer
// met a lossy link, and the next node may answer at once.
const statusAttempt = 5 * time.Second

// clusterStatus is ClusterStatus over the members, within StepTimeout.
func (r *replacer) clusterStatus(ctx context.Context) (*pb.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.StepTimeout)
	defer cancel()
	st, err := ClusterStatus(ctx, r.opts.net(), r.opts.Cluster, min(statusAttempt, r.opts.StepTimeout))
	if err == nil {
		r.leaderAPI = st.LeaderApiAddr
	}
	return st, err
}

// ClusterStatus is the membership as the leader sees it, with each node's
// own report, asked of addrs in turn, each attempt bounded by attempt. A
// follower's view may hold a configuration change that is not committed
// (and may yet be undone), so when a follower answered the leader is asked
// too; its answer wins when it comes.
func ClusterStatus(ctx context.Context, dial Net, addrs []string, attempt time.Duration) (*pb.StatusResponse, error) {
	var st *pb.StatusResponse
	ask := func(ctx context.Context, c pb.MemFSClient) error {
		ctx, cancel := context.WithTimeout(ctx, attempt)
		defer cancel()
		resp, err := c.Status(ctx, &pb.StatusRequest{Version: pb.Version})
		if err == nil && (st == nil || resp.GetSelf().GetState() == "Leader") {
			st = resp
		}
		return err
	}
	if err := CallAddrs(ctx, dial, addrs, ask); err != nil {
		return nil, err
	}
	if st.GetSelf().GetState() != "Leader" && st.LeaderApiAddr != "" {
		_ = CallAddrs(ctx, dial, []string{st.LeaderApiAddr}, ask)
	}
	return st, nil
}

// localStatus is one node's report on itself, bounded by StepTimeout and
// at most 5 s.
func (r *replacer) localStatus(ctx context.Context, addr string) (*pb.NodeStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, min(statusAttempt, r.opts.StepTimeout))
	defer cancel()
	return LocalStatus(ctx, r.opts.net(), addr)
}

// newNodeStatus is the new node's report on itself, asked directly (a
// leader's view of a peer lacks the sync fields and costs a round trip
// more).
func (r *replacer) newNodeStatus(ctx context.Context) (*pb.NodeStatus, error) {
	return r.localStatus(ctx, r.opts.New.APIAddr)
}

// newNodeReport is newNodeStatus, asked again while the answer is lost on
// the way (for at most StepTimeout).
func (r *replacer) newNodeReport(ctx context.Context) (*pb.NodeStatus, error) {
	var self *pb.NodeStatus
	err := r.retry(ctx, func(ctx context.Context) error {
		var err error
		self, err = r.newNodeStatus(ctx)
		return err
	}, func() (bool, error) { return false, nil })
	return self, err
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
		self, err := r.localStatus(ctx, r.leaderAPI)
		if err == nil && self.State == "Leader" {
			return self.CommitIndex, nil
		}
	}
	return 0, errors.New("leader changed while asked")
}
