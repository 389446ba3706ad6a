package server_test

import (
	"context"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

// Linux open flags used by the tests.
const (
	oWronly = 0x1
	oCreat  = 0x40
)

// session is a test client with raw pb commands: it retries UNAVAILABLE
// with the same (session, seq), like the real client.
type session struct {
	t   testing.TB
	cli pb.MemFSClient
	id  uint64
	seq uint64
}

// retryTimeout bounds how long a test command retries through elections.
const retryTimeout = 30 * time.Second

func openSession(t testing.TB, cli pb.MemFSClient) *session {
	t.Helper()
	s := &session{t: t, cli: cli}
	res := s.apply(&pb.Command{Op: &pb.Command_OpenSession{OpenSession: &pb.OpenSessionCmd{LeaseMs: 60_000, Client: t.Name()}}})
	require.Zero(t, res.Errno, res.Message)
	require.NotZero(t, res.Session)
	s.id = res.Session
	return s
}

// apply runs cmd as the session's next command and returns its result.
func (s *session) apply(cmd *pb.Command) *pb.Result {
	s.t.Helper()
	res, err := s.tryApply(cmd)
	require.NoError(s.t, err)
	return res
}

func (s *session) tryApply(cmd *pb.Command) (*pb.Result, error) {
	if s.id != 0 {
		s.seq++
		cmd.Session, cmd.Seq = s.id, s.seq
	}
	req := &pb.ApplyRequest{Version: pb.Version, Command: cmd}
	var resp *pb.ApplyResponse
	err := retryUnavailable(func(ctx context.Context) error {
		var err error
		resp, err = s.cli.Apply(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp.Result, nil
}

// retryUnavailable calls f until it returns anything but UNAVAILABLE (or
// a per-attempt timeout), for up to retryTimeout.
func retryUnavailable(f func(ctx context.Context) error) error {
	deadline := time.Now().Add(retryTimeout)
	backoff := 10 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := f(ctx)
		cancel()
		c := status.Code(err)
		if (c != codes.Unavailable && c != codes.DeadlineExceeded) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(backoff) // backoff between retries, as a client does
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

func (s *session) mkdir(path string) {
	s.t.Helper()
	res := s.apply(&pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: path}, Mode: 0o755}}})
	require.Zero(s.t, res.Errno, "mkdir %s: %s", path, res.Message)
}

// create makes an empty regular file.
func (s *session) create(path string) {
	s.t.Helper()
	res := s.apply(&pb.Command{Op: &pb.Command_Open{Open: &pb.OpenCmd{
		Loc: &pb.Loc{Path: path}, Flags: oCreat | oWronly, Mode: 0o644}}})
	require.Zero(s.t, res.Errno, "create %s: %s", path, res.Message)
	res = s.apply(&pb.Command{Op: &pb.Command_Close{Close: &pb.CloseCmd{Handle: res.Handle}}})
	require.Zero(s.t, res.Errno, "close %s: %s", path, res.Message)
}

// write writes data at off into the file at path (unary: ≤ 1 MiB).
func (s *session) write(path string, off int64, data []byte) *pb.Result {
	s.t.Helper()
	res := s.apply(server.WriteCmd(path, off, data))
	require.Zero(s.t, res.Errno, "write %s: %s", path, res.Message)
	return res
}

// streamWrite writes data with the Write stream in frames of frame bytes.
func (s *session) streamWrite(path string, data []byte, frame int) *pb.Result {
	s.t.Helper()
	s.seq++
	cmd := server.WriteCmd(path, 0, nil)
	cmd.Session, cmd.Seq = s.id, s.seq
	cmd.GetWrite().Length = uint64(len(data))
	var resp *pb.ApplyResponse
	err := retryUnavailable(func(ctx context.Context) error {
		st, err := s.cli.Write(ctx)
		if err != nil {
			return err
		}
		rest := data
		f := &pb.WriteFrame{Version: pb.Version, Command: cmd}
		for {
			n := min(frame, len(rest))
			f.Data, rest = rest[:n], rest[n:]
			if err := st.Send(f); err != nil || len(rest) == 0 {
				break // on error the server ended the stream; CloseAndRecv has its answer
			}
			f = new(pb.WriteFrame)
		}
		resp, err = st.CloseAndRecv()
		return err
	})
	require.NoError(s.t, err)
	require.Zero(s.t, resp.Result.Errno, resp.Result.Message)
	return resp.Result
}

func stat(t testing.TB, cli pb.MemFSClient, path string, c pb.Consistency) *pb.Result {
	t.Helper()
	return query(t, cli, &pb.Query{Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: &pb.Loc{Path: path}}}}, c)
}

func query(t testing.TB, cli pb.MemFSClient, q *pb.Query, c pb.Consistency) *pb.Result {
	t.Helper()
	var resp *pb.QueryResponse
	err := retryUnavailable(func(ctx context.Context) error {
		var err error
		resp, err = cli.Query(ctx, &pb.QueryRequest{Version: pb.Version, Query: q, Consistency: c})
		return err
	})
	require.NoError(t, err)
	return resp.Result
}

// readAll reads a whole file with the Read stream.
func readAll(t testing.TB, cli pb.MemFSClient, path string, c pb.Consistency) []byte {
	t.Helper()
	var out []byte
	err := retryUnavailable(func(ctx context.Context) error {
		out = nil
		st, err := cli.Read(ctx, &pb.QueryRequest{Version: pb.Version, Consistency: c,
			Query: &pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{Loc: &pb.Loc{Path: path}, Length: server.MaxReadBytes}}}})
		if err != nil {
			return err
		}
		for first := true; ; first = false {
			f, err := st.Recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if first {
				require.NotNil(t, f.Result)
				require.Zero(t, f.Result.Errno, "read %s: %s", path, f.Result.Message)
			} else {
				require.Nil(t, f.Result, "only the first frame carries the result")
			}
			require.LessOrEqual(t, len(f.Data), pb.MaxMessageData)
			out = append(out, f.Data...)
		}
	})
	require.NoError(t, err)
	return out
}

func errnoOf(r *pb.Result) syscall.Errno { return syscall.Errno(r.GetErrno()) }

// pattern returns n bytes that differ with seed.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed ^ byte(i>>11)
	}
	return b
}

func follower(c *servertest.Cluster, leader *server.Node, skip int) *server.Node {
	for _, n := range c.Nodes() {
		if n != leader {
			if skip == 0 {
				return n
			}
			skip--
		}
	}
	return nil
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
