package tlsconf_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/internal/pki"
	"github.com/memoryfs/memfs/internal/tlsconf"
)

// failConn counts the writes that reach the socket and fails them once
// failing is set.
type failConn struct {
	net.Conn
	writes  atomic.Int64
	failing atomic.Bool
}

var errInjected = errors.New("injected write failure")

func (c *failConn) Write(p []byte) (int, error) {
	if c.failing.Load() {
		return 0, errInjected
	}
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// coalescedPair returns a client connection whose writes are coalesced,
// the socket under it, and the plain TLS server end, handshakes done.
func coalescedPair(t *testing.T) (*tlsconf.Coalesced, *failConn, *tls.Conn) {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, pki.ClusterSetup(dir, []string{"n1"}, []string{"127.0.0.1"}))
	load := func(name string) *tlsconf.Source {
		s, err := tlsconf.Load(tlsconf.Files{CA: dir + "/" + pki.CAFile, Cert: pki.CertFile(dir, name), Key: pki.KeyFile(dir, name)}, nil)
		require.NoError(t, err)
		return s
	}
	node := load("n1")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = lis.Close() })
	accepted := make(chan *tls.Conn, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			close(accepted)
			return
		}
		sc := tls.Server(c, node.PeerServerConfig())
		if sc.HandshakeContext(context.Background()) != nil {
			close(accepted)
			return
		}
		accepted <- sc
	}()
	raw, err := net.Dial("tcp", lis.Addr().String())
	require.NoError(t, err)
	fc := &failConn{Conn: raw}
	tc, co := tlsconf.Client(fc, node.PeerClientConfig())
	require.NoError(t, tc.HandshakeContext(context.Background()))
	sc, ok := <-accepted
	require.True(t, ok, "server handshake failed")
	t.Cleanup(func() { _ = co.Close(); _ = sc.Close() })
	return co, fc, sc
}

func TestCoalescedWriteSendsRecordsIntactInOneCall(t *testing.T) {
	co, fc, sc := coalescedPair(t)
	for _, size := range []int{1, 100, 16 << 10, 16<<10 + 1, 100 << 10, 256 << 10} {
		data := make([]byte, size)
		_, _ = rand.Read(data)
		before := fc.writes.Load()
		got := make(chan []byte, 1)
		go func() {
			b := make([]byte, size)
			_, err := io.ReadFull(sc, b)
			if err != nil {
				b = nil
			}
			got <- b
		}()
		n, err := co.Write(data)
		require.NoError(t, err)
		require.Equal(t, size, n)
		require.Equal(t, data, <-got, "size %d", size)
		require.Equal(t, int64(1), fc.writes.Load()-before, "size %d: one system call for all its records", size)
	}
	// Larger than what one call carries: in pieces, still intact.
	data := make([]byte, 3<<20)
	_, _ = rand.Read(data)
	before := fc.writes.Load()
	go func() { _, _ = co.Write(data) }()
	got := make([]byte, len(data))
	_, err := io.ReadFull(sc, got)
	require.NoError(t, err)
	require.Equal(t, data, got)
	require.Less(t, fc.writes.Load()-before, int64(len(data)/(16<<10)), "fewer calls than records")
}

func TestCoalescedConcurrentWritersKeepEachWriteWhole(t *testing.T) {
	co, _, sc := coalescedPair(t)
	const writers, each = 8, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for seq := range each {
				// A message: writer, sequence, length, then a
				// payload of the writer's byte.
				size := 1 + (w*7919+seq*104729)%(80<<10)
				msg := make([]byte, 12+size)
				binary.BigEndian.PutUint32(msg, uint32(w))
				binary.BigEndian.PutUint32(msg[4:], uint32(seq))
				binary.BigEndian.PutUint32(msg[8:], uint32(size))
				for i := range size {
					msg[12+i] = byte(w)
				}
				if _, err := co.Write(msg); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	next := make([]int, writers)
	hdr := make([]byte, 12)
	for range writers * each {
		_, err := io.ReadFull(sc, hdr)
		require.NoError(t, err)
		w, seq, size := binary.BigEndian.Uint32(hdr), binary.BigEndian.Uint32(hdr[4:]), binary.BigEndian.Uint32(hdr[8:])
		require.Less(t, int(w), writers)
		require.Equal(t, next[w], int(seq), "writer %d's messages in order", w)
		next[w]++
		body := make([]byte, size)
		_, err = io.ReadFull(sc, body)
		require.NoError(t, err)
		require.Equal(t, bytes.Repeat([]byte{byte(w)}, int(size)), body, "writer %d message %d whole", w, seq)
	}
	wg.Wait()
}

func TestCoalescedWriteErrorIsReturnedAndSticks(t *testing.T) {
	co, fc, _ := coalescedPair(t)
	fc.failing.Store(true)
	n, err := co.Write(make([]byte, 40<<10))
	require.ErrorIs(t, err, errInjected)
	require.Zero(t, n)
	fc.failing.Store(false)
	_, err = co.Write([]byte("after"))
	require.Error(t, err, "the stream is broken after a failed write")
}

func TestCoalescedWriteDeadlines(t *testing.T) {
	co, _, sc := coalescedPair(t)
	require.NoError(t, co.SetWriteDeadline(time.Now().Add(-time.Second)))
	_, err := co.Write([]byte("late"))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)

	// A reader that never reads: the write blocks until its deadline.
	co2, _, _ := coalescedPair(t)
	require.NoError(t, co2.SetWriteDeadline(time.Now().Add(200*time.Millisecond)))
	_, err = co2.Write(make([]byte, 64<<20))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)

	// Read deadlines reach the socket too.
	require.NoError(t, sc.SetReadDeadline(time.Now().Add(-time.Second)))
	require.NoError(t, co.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err = co.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
}
