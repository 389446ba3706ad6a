package faultnet

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
)

// pair is two raft TCP transports, a and b, each wrapped by the same Net;
// b answers every AppendEntries and counts them.
type pair struct {
	n        *Net
	a, b     *Transport
	received atomic.Int64
}

func newPair(t *testing.T) *pair {
	t.Helper()
	p := &pair{n: New(1)}
	mk := func(id string) *Transport {
		inner, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, time.Second, io.Discard)
		require.NoError(t, err)
		tr := WrapTransport(p.n, raft.ServerID(id), inner)
		t.Cleanup(func() { _ = tr.Close() })
		return tr
	}
	p.a, p.b = mk("a"), mk("b")
	go func() {
		for rpc := range p.b.Consumer() {
			p.received.Add(1)
			rpc.Respond(&raft.AppendEntriesResponse{Term: 7, Success: true}, nil)
		}
	}()
	return p
}

func (p *pair) send() (*raft.AppendEntriesResponse, error) {
	var resp raft.AppendEntriesResponse
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("a"), Addr: []byte(p.a.LocalAddr())}, Term: 7}
	err := p.a.AppendEntries("b", p.b.LocalAddr(), req, &resp)
	return &resp, err
}

func TestTransportFaults(t *testing.T) {
	p := newPair(t)

	resp, err := p.send()
	require.NoError(t, err)
	require.True(t, resp.Success)
	require.EqualValues(t, 1, p.received.Load())

	// Symmetric partition: nothing is delivered.
	p.n.Partition([]string{"a"}, []string{"b"})
	_, err = p.send()
	require.ErrorIs(t, err, ErrLinkDown)
	require.EqualValues(t, 1, p.received.Load())

	// One-way b→a: the request arrives, the reply is lost.
	p.n.Heal()
	p.n.Block("b", "a")
	_, err = p.send()
	require.ErrorIs(t, err, ErrLinkDown)
	require.EqualValues(t, 2, p.received.Load())

	// Certain loss of requests.
	p.n.Heal()
	p.n.SetLink("a", "b", Faults{Drop: 1})
	_, err = p.send()
	require.ErrorIs(t, err, ErrDropped)
	require.EqualValues(t, 2, p.received.Load())

	// Certain duplication: the receiver sees the request twice.
	p.n.SetLink("a", "b", Faults{Dup: 1, Jitter: time.Millisecond})
	_, err = p.send()
	require.NoError(t, err)
	require.Eventually(t, func() bool { return p.received.Load() == 4 }, 10*time.Second, 5*time.Millisecond)

	// Pipelines refuse to open over a cut link.
	p.n.Block("a", "b")
	_, err = p.a.AppendEntriesPipeline("b", p.b.LocalAddr())
	require.ErrorIs(t, err, ErrLinkDown)
}

// TestRaftProxyLearnsSource sends a Raft RPC through a proxy and checks
// that a block keyed by the sender's server ID holds it until healed.
func TestRaftProxyLearnsSource(t *testing.T) {
	n := New(2)
	recv, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 5*time.Second, io.Discard)
	require.NoError(t, err)
	t.Cleanup(func() { _ = recv.Close() })
	go func() {
		for rpc := range recv.Consumer() {
			rpc.Respond(&raft.AppendEntriesResponse{Success: true}, nil)
		}
	}()
	px, err := NewRaftProxy(n, string(recv.LocalAddr()), "b")
	require.NoError(t, err)
	t.Cleanup(func() { _ = px.Close(); n.ResetConns("") })

	send, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 30*time.Second, io.Discard)
	require.NoError(t, err)
	t.Cleanup(func() { _ = send.Close() })

	n.Block("a", "b")
	errc := make(chan error, 1)
	go func() {
		var resp raft.AppendEntriesResponse
		req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("a"), Addr: []byte("x")}}
		errc <- send.AppendEntries("b", raft.ServerAddress(px.Addr()), req, &resp)
	}()
	require.Eventually(t, func() bool { return n.Stats.Blocked.Load() > 0 }, 10*time.Second, 5*time.Millisecond)
	select {
	case err := <-errc:
		t.Fatalf("RPC passed a blocked link: %v", err)
	default:
	}
	n.Heal()
	require.NoError(t, <-errc)
}

func TestDialBlackholeAndReset(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c) }()
		}
	}()
	n := New(3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := n.Dial(ctx, "client", "node", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()

	echo := func(msg string) string {
		_, err := c.Write([]byte(msg))
		require.NoError(t, err)
		buf := make([]byte, len(msg))
		_, err = io.ReadFull(c, buf)
		require.NoError(t, err)
		return string(buf)
	}
	require.Equal(t, "hello", echo("hello"))

	// A blackholed reply direction holds the bytes until healed.
	n.Block("node", "client")
	got := make(chan string, 1)
	go func() { got <- echo("held") }()
	require.Eventually(t, func() bool { return n.Stats.Blocked.Load() > 0 }, 10*time.Second, 5*time.Millisecond)
	select {
	case s := <-got:
		t.Fatalf("bytes crossed a blackhole: %q", s)
	default:
	}
	n.Heal()
	require.Equal(t, "held", <-got)

	// A reset ends the connection with an error.
	require.Equal(t, 1, n.ResetConns("node"))
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err)

	// A dial across a partition waits for the caller's deadline.
	n.Partition([]string{"client"}, []string{"node"})
	short, cancel2 := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel2()
	_, err = n.Dial(short, "client", "node", ln.Addr().String())
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// FuzzDecodeRaftSource feeds arbitrary bytes to the header decoder the
// Raft proxy runs on every new connection: it must fail cleanly, never
// panic or hang.
func FuzzDecodeRaftSource(f *testing.F) {
	var b bytes.Buffer
	b.WriteByte(0)
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("n1"), Addr: []byte("127.0.0.1:1")}, Term: 3}
	require.NoError(f, codec.NewEncoder(&b, &codec.MsgpackHandle{}).Encode(req))
	f.Add(b.Bytes())
	f.Add([]byte{1, 0x80})
	f.Add([]byte{9})
	f.Fuzz(func(t *testing.T, data []byte) {
		id, err := decodeRaftSource(bytes.NewReader(data))
		if err == nil && id == "" {
			t.Fatal("no error and no ID")
		}
	})
}

// TestTransportRefusesImpostor has "b" answer with another server's ID,
// as a node of another cluster on a reused address would: the reply must
// be refused and counted.
func TestTransportRefusesImpostor(t *testing.T) {
	n := New(4)
	mk := func(id string) *Transport {
		inner, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, time.Second, io.Discard)
		require.NoError(t, err)
		tr := WrapTransport(n, raft.ServerID(id), inner)
		t.Cleanup(func() { _ = tr.Close() })
		return tr
	}
	a, b := mk("a"), mk("b")
	go func() {
		for rpc := range b.Consumer() {
			rpc.Respond(&raft.AppendEntriesResponse{RPCHeader: raft.RPCHeader{ID: []byte("stranger")}}, nil)
		}
	}()
	var resp raft.AppendEntriesResponse
	err := a.AppendEntries("b", b.LocalAddr(), &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("a")}}, &resp)
	require.ErrorIs(t, err, ErrImpostor)
	require.EqualValues(t, 1, n.Stats.Impostors.Load())
}
