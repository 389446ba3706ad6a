package server_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/proto"
	"github.com/memoryfs/memfs/server"
)

func TestConnectionLimits(t *testing.T) {
	c := server.StartCluster(t, 1, server.WithNodeConfig(func(_ int, cfg *server.Config) {
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
		return server.ClosedWithin(conn, 500*time.Millisecond)
	}, 10*time.Second, 50*time.Millisecond)
	// Connections that never speak are dropped after the handshake
	// timeout, which frees their places.
	for _, conn := range idle {
		require.True(t, server.ClosedWithin(conn, 30*time.Second), "an idle connection outlived the handshake timeout")
		_ = conn.Close()
	}
	require.Eventually(t, func() bool {
		_, err := c.Client(addr).Status(context.Background(), &pb.StatusRequest{Version: pb.Version})
		return err == nil
	}, 30*time.Second, 50*time.Millisecond)
}
