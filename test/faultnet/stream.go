package faultnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// flow relays one TCP connection between a (the side that connected, the
// endpoint named from) and b (the side it reached, the endpoint named to),
// applying the Net's faults to each chunk: delay, reset, and, while a
// direction is blocked, holding its bytes back (a blackhole: nothing
// arrives, nothing fails, until the partition heals or the connection is
// reset).
type flow struct {
	n        *Net
	a, b     net.Conn
	from, to string

	done chan struct{}
	once sync.Once
}

func (n *Net) startFlow(a, b net.Conn, from, to string, prefix []byte) *flow {
	f := &flow{n: n, a: a, b: b, from: from, to: to, done: make(chan struct{})}
	n.mu.Lock()
	n.flows[f] = struct{}{}
	n.mu.Unlock()
	go f.pump(b, a, from, to, prefix)
	go f.pump(a, b, to, from, nil)
	return f
}

// pump copies src to dst, the bytes flowing from→to.
func (f *flow) pump(dst, src net.Conn, from, to string, prefix []byte) {
	if len(prefix) > 0 && !f.forward(dst, prefix, from, to) {
		return
	}
	buf := make([]byte, 32<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 && !f.forward(dst, buf[:k], from, to) {
			return
		}
		if err != nil {
			f.close(false)
			return
		}
	}
}

func (f *flow) forward(dst net.Conn, p []byte, from, to string) bool {
	v := f.n.decide(from, to)
	if v.blocked && !f.n.waitConnected(from, to, f.done) {
		return false
	}
	if v.reset {
		f.n.Stats.Resets.Add(1)
		f.close(true)
		return false
	}
	if !sleep(v.delay, f.done) {
		return false
	}
	if _, err := dst.Write(p); err != nil {
		f.close(false)
		return false
	}
	return true
}

// close ends the flow; with rst the peers see a connection reset rather
// than an orderly end.
func (f *flow) close(rst bool) {
	f.once.Do(func() {
		close(f.done)
		for _, c := range []net.Conn{f.a, f.b} {
			if tc, ok := c.(*net.TCPConn); ok && rst {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
		}
		f.n.mu.Lock()
		delete(f.n.flows, f)
		f.n.mu.Unlock()
	})
}

// ResetConns resets every relayed connection from or to endpoint id ("" for
// all), as a crash of a middlebox or a kernel RST would.
func (n *Net) ResetConns(id string) int {
	n.mu.Lock()
	var victims []*flow
	for f := range n.flows {
		if id == "" || f.from == id || f.to == id {
			victims = append(victims, f)
		}
	}
	n.mu.Unlock()
	for _, f := range victims {
		n.Stats.Resets.Add(1)
		f.close(true)
	}
	if len(victims) > 0 {
		n.Logf("faultnet: reset %d connections of %q", len(victims), id)
	}
	return len(victims)
}

// Dial connects endpoint from to endpoint to at addr through the Net's
// faults, without a listener: the caller gets one end of an in-memory pipe
// and a relay carries the bytes to the real TCP connection. It suits
// client.WithDialer.
func (n *Net) Dial(ctx context.Context, from, to, addr string) (net.Conn, error) {
	if !n.Connected(from, to) {
		// A blackholed SYN: the dial hangs until the caller gives up or the
		// partition heals.
		done := make(chan struct{})
		stop := context.AfterFunc(ctx, func() { close(done) })
		ok := n.waitConnected(from, to, done)
		stop()
		if !ok {
			return nil, fmt.Errorf("faultnet: dial %s→%s: %w", from, to, context.Cause(ctx))
		}
	}
	var d net.Dialer
	remote, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	app, relay := net.Pipe()
	n.startFlow(relay, remote, from, to, nil)
	return app, nil
}

// Proxy is a TCP listener on loopback that relays each accepted connection
// to a target address through the Net's faults. Each connection's source
// endpoint is either fixed (From) or, for Raft links between real
// processes, read from the first Raft RPC on the connection.
type Proxy struct {
	n      *Net
	ln     net.Listener
	target string
	from   string // "" = identify from the Raft RPC header
	to     string

	wg sync.WaitGroup
}

// NewProxy listens on 127.0.0.1:0 and relays to target; the bytes flow
// over the link from→to (and replies to→from).
func NewProxy(n *Net, target, from, to string) (*Proxy, error) {
	return newProxy(n, target, from, to)
}

// NewRaftProxy is NewProxy for a Raft port: every peer dials the same
// address, so the source of a connection is learnt from the server ID in
// the header of its first Raft RPC.
func NewRaftProxy(n *Net, target, to string) (*Proxy, error) {
	return newProxy(n, target, "", to)
}

func newProxy(n *Net, target, from, to string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	p := &Proxy{n: n, ln: ln, target: target, from: from, to: to}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the address clients (or peers) should dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address behind the proxy.
func (p *Proxy) Target() string { return p.target }

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *Proxy) handle(c net.Conn) {
	from, prefix := p.from, []byte(nil)
	if from == "" {
		var err error
		from, prefix, err = peekRaftSource(c)
		if err != nil {
			_ = c.Close()
			return
		}
	}
	remote, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	p.n.startFlow(c, remote, from, p.to, prefix)
}

// Close stops accepting; relayed connections are reset with ResetConns.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

var _ io.Closer = (*Proxy)(nil)
