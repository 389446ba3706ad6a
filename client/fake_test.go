package client

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/memoryfs/memfs/memfspb"
)

// fakeCluster is a stand-in for a MemoryFS cluster that is just enough to
// test the client's protocol handling: sessions, deduplication by (session,
// seq), leader hints, streams, and files as byte slices by path. Tests
// inject failures through the hooks.
type fakeCluster struct {
	t *testing.T

	mu          sync.Mutex
	nodes       []*fakeNode
	leader      int // index of the leader in nodes, -1 for none
	nextSession uint64
	sessions    map[uint64]bool
	dups        map[[2]uint64]*pb.Result
	applied     []*pb.Command // every command applied (not deduplicated)
	attempts    int           // Apply and Write calls that reached a node
	nextHandle  uint64
	handles     map[uint64]uint64 // handle -> session
	files       map[string][]byte

	// applyHook, if set, runs first for every Apply/Write attempt; a
	// non-nil error is returned to the client instead of applying.
	applyHook func(node int, cmd *pb.Command) error
	// afterHook, if set, runs after a command is applied; a non-nil error
	// is returned instead of the result (a reply lost after applying).
	afterHook func(node int, cmd *pb.Command) error
	// readHook, if set, may break a Read stream after the first frame.
	readHook func(attempt int) bool
	reads    int
}

type fakeNode struct {
	pb.UnimplementedMemFSServer
	fc   *fakeCluster
	i    int
	addr string
	srv  *grpc.Server
}

func newFakeCluster(t *testing.T, n int) *fakeCluster {
	fc := &fakeCluster{t: t, sessions: map[uint64]bool{}, dups: map[[2]uint64]*pb.Result{},
		handles: map[uint64]uint64{}, files: map[string][]byte{}}
	for i := range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		node := &fakeNode{fc: fc, i: i, addr: lis.Addr().String(), srv: grpc.NewServer()}
		pb.RegisterMemFSServer(node.srv, node)
		go func() { _ = node.srv.Serve(lis) }()
		t.Cleanup(node.srv.Stop)
		fc.nodes = append(fc.nodes, node)
	}
	return fc
}

func (fc *fakeCluster) addrs() []string {
	var out []string
	for _, n := range fc.nodes {
		out = append(out, n.addr)
	}
	return out
}

func (fc *fakeCluster) onApply(f func(node int, cmd *pb.Command) error) {
	fc.mu.Lock()
	fc.applyHook = f
	fc.mu.Unlock()
}

func (fc *fakeCluster) onAfter(f func(node int, cmd *pb.Command) error) {
	fc.mu.Lock()
	fc.afterHook = f
	fc.mu.Unlock()
}

func (fc *fakeCluster) onRead(f func(attempt int) bool) {
	fc.mu.Lock()
	fc.readHook = f
	fc.mu.Unlock()
}

func (fc *fakeCluster) setLeader(i int) {
	fc.mu.Lock()
	fc.leader = i
	fc.mu.Unlock()
}

func (fc *fakeCluster) leaderAddr() string {
	if fc.leader < 0 {
		return ""
	}
	return fc.nodes[fc.leader].addr
}

func (fc *fakeCluster) newClient(t *testing.T, opts ...Option) *Client {
	t.Helper()
	c, err := New(t.Context(), fc.addrs(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (n *fakeNode) notLeader(ctx context.Context) error {
	n.fc.mu.Lock()
	hint := n.fc.leaderAddr()
	isLeader := n.fc.leader == n.i
	n.fc.mu.Unlock()
	if isLeader {
		return nil
	}
	if hint != "" {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(pb.LeaderTrailer, hint))
	}
	return status.Error(codes.Unavailable, "not the leader")
}

func (n *fakeNode) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	n.fc.mu.Lock()
	defer n.fc.mu.Unlock()
	st := &pb.StatusResponse{LeaderApiAddr: n.fc.leaderAddr()}
	for _, m := range n.fc.nodes {
		st.Nodes = append(st.Nodes, &pb.NodeStatus{ApiAddr: m.addr})
	}
	return st, nil
}

func (n *fakeNode) Apply(ctx context.Context, req *pb.ApplyRequest) (*pb.ApplyResponse, error) {
	if req.Version != pb.Version {
		return nil, status.Error(codes.FailedPrecondition, "version")
	}
	res, err := n.run(ctx, req.Command)
	if err != nil {
		return nil, err
	}
	return &pb.ApplyResponse{Result: res}, nil
}

func (n *fakeNode) Write(st grpc.ClientStreamingServer[pb.WriteFrame, pb.ApplyResponse]) error {
	first, err := st.Recv()
	if err != nil {
		return err
	}
	cmd := first.Command
	data := append([]byte(nil), first.Data...)
	for {
		f, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if len(f.Data) > pb.MaxMessageData || f.Command != nil {
			return status.Error(codes.InvalidArgument, "bad frame")
		}
		data = append(data, f.Data...)
	}
	cmd.GetWrite().Data = append(cmd.GetWrite().Data, data...)
	res, err := n.run(st.Context(), cmd)
	if err != nil {
		return err
	}
	return st.SendAndClose(&pb.ApplyResponse{Result: res})
}

// run applies cmd on the leader, with dedup.
func (n *fakeNode) run(ctx context.Context, cmd *pb.Command) (*pb.Result, error) {
	fc := n.fc
	fc.mu.Lock()
	fc.attempts++
	hook := fc.applyHook
	fc.mu.Unlock()
	if hook != nil {
		if err := hook(n.i, cmd); err != nil {
			return nil, err
		}
	}
	if err := n.notLeader(ctx); err != nil {
		return nil, err
	}
	fc.mu.Lock()
	res := fc.applyLocked(cmd)
	after := fc.afterHook
	fc.mu.Unlock()
	if after != nil {
		if err := after(n.i, cmd); err != nil {
			return nil, err
		}
	}
	return res, nil
}

func (fc *fakeCluster) applyLocked(cmd *pb.Command) *pb.Result {
	if o, ok := cmd.Op.(*pb.Command_OpenSession); ok {
		fc.nextSession++
		fc.sessions[fc.nextSession] = true
		return &pb.Result{Session: fc.nextSession, LeaseMs: o.OpenSession.LeaseMs}
	}
	if !fc.sessions[cmd.Session] {
		return &pb.Result{Errno: uint32(syscall.ESTALE)}
	}
	key := [2]uint64{cmd.Session, cmd.Seq}
	if r, ok := fc.dups[key]; ok {
		return r
	}
	fc.applied = append(fc.applied, proto.Clone(cmd).(*pb.Command))
	res := fc.exec(cmd)
	fc.dups[key] = res
	return res
}

func (fc *fakeCluster) exec(cmd *pb.Command) *pb.Result {
	switch op := cmd.Op.(type) {
	case *pb.Command_Open:
		fc.nextHandle++
		fc.handles[fc.nextHandle] = cmd.Session
		return &pb.Result{Handle: fc.nextHandle, Attr: &pb.Attr{Ino: 2, Mode: sIFREG | 0o644}}
	case *pb.Command_Close:
		if fc.handles[op.Close.Handle] != cmd.Session {
			return &pb.Result{Errno: uint32(syscall.EBADF)}
		}
		delete(fc.handles, op.Close.Handle)
	case *pb.Command_Write:
		w := op.Write
		p := w.GetLoc().GetPath()
		if w.Handle != 0 {
			if fc.handles[w.Handle] != cmd.Session {
				return &pb.Result{Errno: uint32(syscall.EBADF)}
			}
			p = "handle"
		}
		f := fc.files[p]
		off := int(w.Offset)
		if w.Append {
			off = len(f)
		}
		if end := off + len(w.Data); end > len(f) {
			f = append(f, make([]byte, end-len(f))...)
		}
		copy(f[off:], w.Data)
		fc.files[p] = f
		return &pb.Result{N: uint64(len(w.Data)), Attr: &pb.Attr{Size: uint64(len(f))}}
	case *pb.Command_Mkdir:
		if _, ok := fc.files[op.Mkdir.Loc.GetPath()]; ok {
			return &pb.Result{Errno: uint32(syscall.EEXIST)}
		}
		fc.files[op.Mkdir.Loc.GetPath()] = nil
	case *pb.Command_Remove:
		if _, ok := fc.files[op.Remove.Loc.GetPath()]; !ok {
			return &pb.Result{Errno: uint32(syscall.ENOENT)}
		}
		delete(fc.files, op.Remove.Loc.GetPath())
	case *pb.Command_CloseSession:
		delete(fc.sessions, cmd.Session)
	}
	return &pb.Result{}
}

func (n *fakeNode) Query(ctx context.Context, req *pb.QueryRequest) (*pb.QueryResponse, error) {
	if err := n.notLeader(ctx); err != nil {
		return nil, err
	}
	fc := n.fc
	fc.mu.Lock()
	defer fc.mu.Unlock()
	switch q := req.Query.Q.(type) {
	case *pb.Query_Read:
		return &pb.QueryResponse{Result: fc.readLocked(q.Read, pb.MaxMessageData)}, nil
	case *pb.Query_Stat:
		f, ok := fc.files[q.Stat.Loc.GetPath()]
		if !ok {
			return &pb.QueryResponse{Result: &pb.Result{Errno: uint32(syscall.ENOENT)}}, nil
		}
		return &pb.QueryResponse{Result: &pb.Result{Attr: &pb.Attr{Ino: 2, Mode: sIFREG | 0o644, Size: uint64(len(f))}}}, nil
	}
	return &pb.QueryResponse{Result: &pb.Result{Errno: uint32(syscall.ENOSYS)}}, nil
}

// readLocked reads by path, at most limit bytes.
func (fc *fakeCluster) readLocked(r *pb.ReadQuery, limit int64) *pb.Result {
	p := r.GetLoc().GetPath()
	if r.Handle != 0 {
		p = "handle"
	}
	f, ok := fc.files[p]
	if !ok {
		return &pb.Result{Errno: uint32(syscall.ENOENT)}
	}
	off := min(int(r.Offset), len(f))
	end := min(off+int(min(r.Length, limit)), len(f))
	return &pb.Result{Data: append([]byte(nil), f[off:end]...), Eof: end == len(f)}
}

func (n *fakeNode) Read(req *pb.QueryRequest, st grpc.ServerStreamingServer[pb.ReadFrame]) error {
	if err := n.notLeader(st.Context()); err != nil {
		return err
	}
	fc := n.fc
	fc.mu.Lock()
	fc.reads++
	attempt := fc.reads
	// Cap a stream below what was asked so the client must continue.
	res := fc.readLocked(req.Query.GetRead(), 3*pb.MaxMessageData)
	hook := fc.readHook
	fc.mu.Unlock()
	data := res.Data
	res.Data = nil
	for i := 0; i == 0 || len(data) > 0; i++ {
		piece := data[:min(len(data), pb.MaxMessageData)]
		data = data[len(piece):]
		f := &pb.ReadFrame{Data: piece}
		if i == 0 {
			f.Result = res
		}
		if err := st.Send(f); err != nil {
			return err
		}
		if i == 0 && hook != nil && hook(attempt) {
			return status.Error(codes.Unavailable, "stream broken by test")
		}
	}
	return nil
}
