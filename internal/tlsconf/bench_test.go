package tlsconf_test

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/memoryfs/memfs/internal/grpcopts"
	"github.com/memoryfs/memfs/internal/pki"
	"github.com/memoryfs/memfs/internal/tlsconf"
	pb "github.com/memoryfs/memfs/memfspb"
)

// streamServer answers the two streams file data travels on, as a node
// does but with nothing behind them: Write consumes frames, Read sends
// one frame of the size asked.
type streamServer struct {
	pb.UnimplementedMemFSServer
	data []byte
}

func (s *streamServer) Write(st grpc.ClientStreamingServer[pb.WriteFrame, pb.ApplyResponse]) error {
	for {
		if _, err := st.Recv(); errors.Is(err, io.EOF) {
			return st.SendAndClose(&pb.ApplyResponse{})
		} else if err != nil {
			return err
		}
	}
}

func (s *streamServer) Read(_ *pb.QueryRequest, st grpc.ServerStreamingServer[pb.ReadFrame]) error {
	return st.Send(&pb.ReadFrame{Data: s.data})
}

// countConn counts the system calls made on the socket.
type countConn struct {
	net.Conn
	calls *calls
}

type calls struct{ reads, writes atomic.Int64 }

func (c countConn) Write(p []byte) (int, error) {
	c.calls.writes.Add(1)
	return c.Conn.Write(p)
}

func (c countConn) Read(p []byte) (int, error) {
	c.calls.reads.Add(1)
	return c.Conn.Read(p)
}

type countListener struct {
	net.Listener
	calls *calls
}

func (l countListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countConn{c, l.calls}, nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStream measures what file data costs through the API's gRPC
// streams over loopback, plaintext and TLS (client and server in this
// process): 1 MiB writes and reads, 16 in flight, as `memfs bench` does.
// Besides the wall-clock rate it reports the process's CPU seconds per GB
// and the socket writes and reads per MB, which hold their meaning on a loaded
// machine: compare cpu-s/GB of a TLS mode with plain's.
func BenchmarkStream(b *testing.B) {
	dir := b.TempDir()
	require.NoError(b, pki.ClusterSetup(dir, []string{"n1"}, []string{"127.0.0.1"}))
	node, err := tlsconf.Load(tlsconf.Files{CA: dir + "/" + pki.CAFile, Cert: pki.CertFile(dir, "n1"), Key: pki.KeyFile(dir, "n1")}, nil)
	require.NoError(b, err)
	admin, err := tlsconf.Load(tlsconf.Files{CA: dir + "/" + pki.CAFile, Cert: pki.CertFile(dir, "admin"), Key: pki.KeyFile(dir, "admin")}, nil)
	require.NoError(b, err)

	// old: the settings before records were coalesced (gRPC's TLS
	// credentials, its default buffers, the client's windows only);
	// new: those of the node and client now.
	oldServer := []grpc.ServerOption{}
	oldClient := []grpc.DialOption{grpc.WithInitialWindowSize(4 << 20), grpc.WithInitialConnWindowSize(16 << 20)}
	modes := []struct {
		name           string
		server, client credentials.TransportCredentials
		sopts          []grpc.ServerOption
		copts          []grpc.DialOption
	}{
		{"old/plain", insecure.NewCredentials(), insecure.NewCredentials(), oldServer, oldClient},
		{"old/tls", credentials.NewTLS(node.ServerConfig()), credentials.NewTLS(admin.ClientConfig()), oldServer, oldClient},
		{"new/plain", insecure.NewCredentials(), insecure.NewCredentials(), grpcopts.Server(false), grpcopts.Client(false)},
		{"new/tls", tlsconf.NewCredentials(node.ServerConfig()), tlsconf.NewCredentials(admin.ClientConfig()), grpcopts.Server(true), grpcopts.Client(true)},
	}
	for _, m := range modes {
		for _, op := range []string{"write", "read"} {
			b.Run(m.name+"/"+op, func(b *testing.B) {
				benchStream(b, op, append(m.sopts, grpc.Creds(m.server)), append(m.copts, grpc.WithTransportCredentials(m.client)))
			})
		}
	}
}

func benchStream(b *testing.B, op string, sopts []grpc.ServerOption, copts []grpc.DialOption) {
	const size = 1 << 20
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var sys calls
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	srv := grpc.NewServer(sopts...)
	pb.RegisterMemFSServer(srv, &streamServer{data: data})
	go func() { _ = srv.Serve(countListener{lis, &sys}) }()
	defer srv.Stop()
	cc, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), append(copts,
		grpc.WithAuthority("127.0.0.1"),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			return countConn{c, &sys}, nil
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20)))...)
	require.NoError(b, err)
	defer func() { _ = cc.Close() }()
	api := pb.NewMemFSClient(cc)
	ctx := context.Background()
	one := func() error {
		if op == "read" {
			st, err := api.Read(ctx, &pb.QueryRequest{})
			if err != nil {
				return err
			}
			for {
				if _, err := st.Recv(); errors.Is(err, io.EOF) {
					return nil
				} else if err != nil {
					return err
				}
			}
		}
		st, err := api.Write(ctx)
		if err != nil {
			return err
		}
		if err := st.Send(&pb.WriteFrame{Data: data}); err != nil {
			return err
		}
		_, err = st.CloseAndRecv()
		return err
	}
	require.NoError(b, one()) // connect and handshake outside the measurement

	b.SetBytes(size)
	b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
	sys.reads.Store(0)
	sys.writes.Store(0)
	cpu0 := cpuTime()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := one(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	mb := float64(b.N) * size / 1e6
	b.ReportMetric((cpuTime()-cpu0).Seconds()/(mb/1e3), "cpu-s/GB")
	b.ReportMetric(float64(sys.writes.Load())/mb, "writes/MB")
	b.ReportMetric(float64(sys.reads.Load())/mb, "reads/MB")
}
