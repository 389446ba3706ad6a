package server_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server"
	"github.com/memoryfs/memfs/server/servertest"
)

func TestConnectionLimits(t *testing.T) {
	c := servertest.StartCluster(t, 1, servertest.WithNodeConfig(func(_ int, cfg *server.Config) {
		cfg.Limits.MaxConnsPerHost = 40
		cfg.Limits.HandshakeTimeout = 2 * time.Second
	}))
	addr := c.Node(0).APIAddr()
	var idle []net.Conn
	for range 40 {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		idle = append(idle, conn)
	}
	// Past the limit a connection is closed at once.
	require.Eventually(t, func() bool {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		defer conn.Close()
		return servertest.ClosedWithin(conn, 500*time.Millisecond)
	}, 10*time.Second, 50*time.Millisecond)
	// Connections that never speak are dropped after the handshake
	// timeout, which frees their places.
	for _, conn := range idle {
		require.True(t, servertest.ClosedWithin(conn, 30*time.Second), "an idle connection outlived the handshake timeout")
		_ = conn.Close()
	}
	require.Eventually(t, func() bool {
		_, err := c.Client(addr).Status(context.Background(), &pb.StatusRequest{Version: pb.Version})
		return err == nil
	}, 30*time.Second, 50*time.Millisecond)
}

func TestNewConnectionRatePerHost(t *testing.T) {
	c := servertest.StartCluster(t, 1, servertest.WithNodeConfig(func(_ int, cfg *server.Config) {
		cfg.Limits.NewConnsPerHost = 5
	}))
	addr := c.Node(0).APIAddr()
	// Another loopback address is another host: a flood from it is cut
	// at its burst, closed before any handshake.
	flood := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	var conns, kept []net.Conn
	for range 20 {
		conn, err := flood.Dial("tcp", addr)
		require.NoError(t, err)
		conns = append(conns, conn)
	}
	closed := 0
	for _, conn := range conns {
		if servertest.ClosedWithin(conn, 100*time.Millisecond) {
			closed++
		} else {
			kept = append(kept, conn)
		}
	}
	for _, conn := range kept {
		_ = conn.Close()
	}
	require.GreaterOrEqual(t, closed, 10, "connections from the flooding host closed at once")
	require.LessOrEqual(t, len(kept), 10, "connections from the flooding host kept")
	// Its clients on other hosts are served all the while.
	_, err := c.Client(addr).Status(context.Background(), &pb.StatusRequest{Version: pb.Version})
	require.NoError(t, err)
}
