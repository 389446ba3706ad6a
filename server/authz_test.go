package server_test

import (
	"context"
	"errors"
	"io/fs"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/internal/pki"
	"github.com/memoryfs/memfs/internal/tlsconf"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/authz"
	"github.com/memoryfs/memfs/server/servertest"
)

// roleConns dials addr once per role: without certificate, and with a
// certificate of each role.
func roleConns(t *testing.T, c *servertest.Cluster, addr string) map[pb.Role]*grpc.ClientConn {
	t.Helper()
	dir := t.TempDir()
	caFile := c.CertFiles("admin").CA
	srcs := map[pb.Role]*tlsconf.Source{
		pb.Role_ROLE_NONE: loadTLS(t, tlsconf.Files{CA: caFile}),
		pb.Role_ROLE_NODE: c.NodeTLS("probe"),
	}
	for _, r := range []pb.Role{pb.Role_ROLE_READ, pb.Role_ROLE_WRITE, pb.Role_ROLE_ADMIN} {
		name := authz.RoleName(r)
		srcs[r] = loadTLS(t, issue(t, c.CA(), dir, caFile, pki.Request{Name: "as-" + name, Role: name}))
	}
	out := map[pb.Role]*grpc.ClientConn{}
	for r, src := range srcs {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(src.ClientConfig())))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		out[r] = conn
	}
	return out
}

var allRoles = []pb.Role{pb.Role_ROLE_NONE, pb.Role_ROLE_READ, pb.Role_ROLE_WRITE, pb.Role_ROLE_ADMIN, pb.Role_ROLE_NODE}

// call invokes method m with in, unary or streaming, and returns its error.
func call(ctx context.Context, conn *grpc.ClientConn, full string, m protoreflect.MethodDescriptor, in proto.Message) error {
	outType, err := protoregistry.GlobalTypes.FindMessageByName(m.Output().FullName())
	if err != nil {
		return err
	}
	out := outType.New().Interface()
	if !m.IsStreamingClient() && !m.IsStreamingServer() {
		return conn.Invoke(ctx, full, in, out)
	}
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{StreamName: string(m.Name()),
		ServerStreams: m.IsStreamingServer(), ClientStreams: m.IsStreamingClient()}, full)
	if err != nil {
		return err
	}
	if err := st.SendMsg(in); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		// io.EOF: the server ended the stream; RecvMsg has its status.
		_ = err
	}
	_ = st.CloseSend()
	return st.RecvMsg(out)
}

// checkRefusal requires err to be the refusal for role when role < need,
// and anything else (the handler ran and judged the request) otherwise.
func checkRefusal(t *testing.T, what string, role, need pb.Role, err error) {
	t.Helper()
	code := status.Code(err)
	switch {
	case role == pb.Role_ROLE_NONE && need > role:
		require.Equal(t, codes.Unauthenticated, code, "%s without credentials: %v", what, err)
	case role < need:
		require.Equal(t, codes.PermissionDenied, code, "%s as %s: %v", what, authz.RoleName(role), err)
	default:
		require.NotContains(t, []codes.Code{codes.PermissionDenied, codes.Unauthenticated}, code,
			"%s as %s must pass authorization: %v", what, authz.RoleName(role), err)
	}
}

// TestEveryMethodChecksItsRole walks every method of the MemFS service,
// every command of Apply and every query of Query, and calls each as a
// caller of every role: below the role the table names it is refused
// (Unauthenticated without credentials, PermissionDenied with too little),
// at or above it reaches the handler. The requests carry protocol version
// 0, so a handler that is reached refuses them without doing anything.
func TestEveryMethodChecksItsRole(t *testing.T) {
	c := servertest.StartCluster(t, 1, servertest.WithTLS())
	conns := roleConns(t, c, c.Node(0).APIAddr())
	svc := pb.File_memfs_proto.Services().ByName("MemFS")
	for i := range svc.Methods().Len() {
		m := svc.Methods().Get(i)
		full := "/" + string(svc.FullName()) + "/" + string(m.Name())
		inType, err := protoregistry.GlobalTypes.FindMessageByName(m.Input().FullName())
		require.NoError(t, err)
		for _, r := range allRoles {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			err := call(ctx, conns[r], full, m, inType.New().Interface())
			cancel()
			checkRefusal(t, full, r, authz.Method(full), err)
		}
	}
	ops := (&pb.Command{}).ProtoReflect().Descriptor().Oneofs().ByName("op").Fields()
	for i := range ops.Len() {
		fd := ops.Get(i)
		cmd := &pb.Command{}
		cmd.ProtoReflect().Set(fd, protoreflect.ValueOfMessage(cmd.ProtoReflect().NewField(fd).Message()))
		for _, r := range allRoles {
			_, err := pb.NewMemFSClient(conns[r]).Apply(context.Background(), &pb.ApplyRequest{Command: cmd})
			checkRefusal(t, "command "+string(fd.Name()), r, authz.Command(cmd), err)
		}
	}
	qs := (&pb.Query{}).ProtoReflect().Descriptor().Oneofs().ByName("q").Fields()
	for i := range qs.Len() {
		fd := qs.Get(i)
		q := &pb.Query{}
		q.ProtoReflect().Set(fd, protoreflect.ValueOfMessage(q.ProtoReflect().NewField(fd).Message()))
		for _, r := range allRoles {
			_, err := pb.NewMemFSClient(conns[r]).Query(context.Background(), &pb.QueryRequest{Query: q})
			checkRefusal(t, "query "+string(fd.Name()), r, authz.Query(q), err)
		}
	}
}

// TestRolesThroughTheClient: what each role may do, through the client
// library as programs use it, and that a refusal changes nothing.
func TestRolesThroughTheClient(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithTLS())
	admin, _ := tlsClient(t, c, "admin")
	require.NoError(t, admin.WriteFile("/f", []byte("original"), 0o644))
	dir := t.TempDir()
	caFile := c.CertFiles("admin").CA
	as := func(role string) *client.Client {
		src := loadTLS(t, issue(t, c.CA(), dir, caFile, pki.Request{Name: "as-" + role, Role: role}))
		cl, err := client.New(context.Background(), c.APIAddrs(), client.WithTLS(src.ClientConfig()), client.WithRetryTimeout(10*time.Second))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	reader, writer := as(pki.RoleRead), as(pki.RoleWrite)

	got, err := reader.ReadFile("/f")
	require.NoError(t, err)
	require.Equal(t, "original", string(got))
	for _, op := range []struct {
		name string
		do   func() error
	}{
		{"write", func() error { return reader.WriteFile("/f", []byte("changed"), 0o644) }},
		{"create", func() error { return reader.WriteFile("/g", []byte("new"), 0o644) }},
		{"mkdir", func() error { return reader.Mkdir("/d", 0o755) }},
		{"remove", func() error { return reader.Remove("/f") }},
		{"chmod", func() error { return reader.Chmod("/f", 0o600) }},
	} {
		err := op.do()
		require.Error(t, err, op.name)
		require.Equal(t, codes.PermissionDenied, status.Code(err), "%s: %v", op.name, err)
		require.ErrorIs(t, err, syscall.EACCES, "%s: the mount answers EACCES", op.name)
		require.ErrorIs(t, err, fs.ErrPermission, op.name)
	}
	require.NoError(t, writer.WriteFile("/g", []byte("by writer"), 0o644))
	_, err = writer.Do(context.Background(), &pb.Command{Op: &pb.Command_TokenCreate{TokenCreate: &pb.TokenCreateCmd{
		Hash: authz.TokenHash("x"), Role: pb.Role_ROLE_ADMIN}}})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)

	got, err = admin.ReadFile("/f")
	require.NoError(t, err)
	require.Equal(t, "original", string(got))
	_, err = admin.Stat("/d")
	require.ErrorIs(t, err, fs.ErrNotExist)
	toks, err := admin.Query(context.Background(), &pb.Query{Q: &pb.Query_Tokens{Tokens: &pb.TokensQuery{}}})
	require.NoError(t, err)
	require.Empty(t, toks.Tokens)
}

// TestTokens: a token made by an admin authenticates with its role on
// every node, a revoked one and an expired one do not.
func TestTokens(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithTLS())
	admin, _ := tlsClient(t, c, "admin")
	caOnly := loadTLS(t, tlsconf.Files{CA: c.CertFiles("admin").CA})
	create := func(text string, role pb.Role, ttl time.Duration) *pb.Token {
		r, err := admin.Do(context.Background(), &pb.Command{Op: &pb.Command_TokenCreate{TokenCreate: &pb.TokenCreateCmd{
			Hash: authz.TokenHash(text), Role: role, Name: "test", TtlMs: ttl.Milliseconds()}}})
		require.NoError(t, err)
		require.Len(t, r.Tokens, 1)
		return r.Tokens[0]
	}
	// dial connects with a token; New opens a session, so it fails where
	// the token is not (or no longer) known.
	dial := func(addr, text string) (*client.Client, error) {
		cl, err := client.New(context.Background(), []string{addr}, client.WithTLS(caOnly.ClientConfig()),
			client.WithToken(text), client.WithRetryTimeout(5*time.Second))
		if err == nil {
			t.Cleanup(func() { _ = cl.Close() })
		}
		return cl, err
	}
	onNode := func(addr, text string) *client.Client {
		cl, err := dial(addr, text)
		require.NoError(t, err)
		return cl
	}
	w := create("writer token text", pb.Role_ROLE_WRITE, 0)
	create("reader token text", pb.Role_ROLE_READ, time.Hour)
	for _, n := range c.Nodes() {
		// A follower knows the token once it has applied its entry.
		require.Eventually(t, func() bool {
			cl, err := dial(n.APIAddr(), "writer token text")
			if err != nil {
				return false
			}
			_, err = cl.Statfs(context.Background())
			return err == nil
		}, 30*time.Second, 50*time.Millisecond, "node %s", n.ID())
	}
	require.NoError(t, onNode(c.Node(0).APIAddr(), "writer token text").WriteFile("/by-token", []byte("x"), 0o644))
	err := onNode(c.Node(0).APIAddr(), "reader token text").WriteFile("/by-reader", []byte("x"), 0o644)
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	_, err = dial(c.Node(0).APIAddr(), "a token nobody made")
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	require.ErrorIs(t, err, syscall.EPERM)

	_, err = admin.Do(context.Background(), &pb.Command{Op: &pb.Command_TokenRevoke{TokenRevoke: &pb.TokenRevokeCmd{Id: w.Id}}})
	require.NoError(t, err)
	for _, n := range c.Nodes() {
		require.Eventually(t, func() bool {
			_, err := dial(n.APIAddr(), "writer token text")
			return status.Code(err) == codes.Unauthenticated
		}, 30*time.Second, 50*time.Millisecond, "node %s still takes the revoked token", n.ID())
	}

	create("short-lived", pb.Role_ROLE_WRITE, time.Millisecond)
	require.Eventually(t, func() bool {
		_, err := dial(c.Node(0).APIAddr(), "short-lived")
		return status.Code(err) == codes.Unauthenticated
	}, 30*time.Second, 50*time.Millisecond)

	// A token is never sent without TLS: gRPC refuses the call.
	_, err = client.New(context.Background(), c.APIAddrs(), client.WithToken("reader token text"),
		client.WithRetryTimeout(2*time.Second))
	require.ErrorContains(t, err, "require transport level security")
}

// TestSessionsBelongToTheirOwner: a client replaying another client's
// (session, seq), or sending new commands in its session, gets EPERM and
// changes nothing; the owner's own retry still gets its recorded result.
func TestSessionsBelongToTheirOwner(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.WithTLS())
	dir := t.TempDir()
	caFile := c.CertFiles("admin").CA
	conn := func(name string) pb.MemFSClient {
		src := loadTLS(t, issue(t, c.CA(), dir, caFile, pki.Request{Name: name, Role: pki.RoleWrite}))
		// Through a follower: the owner must survive forwarding.
		lead := c.WaitLeader(30 * time.Second)
		addr := c.Node((c.Index(lead) + 1) % 3).APIAddr()
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(src.ClientConfig())))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cc.Close() })
		return pb.NewMemFSClient(cc)
	}
	alice, mallory := conn("alice"), conn("mallory")
	ctx := context.Background()
	apply := func(cli pb.MemFSClient, cmd *pb.Command) *pb.Result {
		resp, err := cli.Apply(ctx, &pb.ApplyRequest{Version: pb.Version, Command: cmd})
		require.NoError(t, err)
		return resp.Result
	}
	open := apply(alice, &pb.Command{Owner: "cert:mallory", // a client's own owner is ignored
		Op: &pb.Command_OpenSession{OpenSession: &pb.OpenSessionCmd{LeaseMs: 60_000}}})
	require.Zero(t, open.Errno, open.Message)
	sess := open.Session
	write := func(data string, seq uint64) *pb.Command {
		return &pb.Command{Session: sess, Seq: seq, Ack: seq, Op: &pb.Command_Write{Write: &pb.WriteCmd{
			Loc: &pb.Loc{Path: "/f"}, Data: []byte(data), Create: true, Truncate: true, Mode: 0o644}}}
	}
	first := apply(alice, write("alice", 1))
	require.Zero(t, first.Errno, first.Message)

	replay := apply(mallory, write("mallory", 1))
	require.Equal(t, uint32(syscall.EPERM), replay.Errno, replay.Message)
	fresh := apply(mallory, write("mallory", 2))
	require.Equal(t, uint32(syscall.EPERM), fresh.Errno, fresh.Message)
	spoof := write("mallory", 3)
	spoof.Owner = "cert:alice"
	require.Equal(t, uint32(syscall.EPERM), apply(mallory, spoof).Errno, "a client cannot claim an owner")

	again := apply(alice, write("alice", 1))
	require.Zero(t, again.Errno, again.Message)
	require.Equal(t, first.N, again.N, "the owner's retry gets its recorded result")
	q, err := alice.Query(ctx, &pb.QueryRequest{Version: pb.Version,
		Query: &pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{Loc: &pb.Loc{Path: "/f"}, Length: 100}}}})
	require.NoError(t, err)
	require.Equal(t, "alice", string(q.Result.Data))
}
