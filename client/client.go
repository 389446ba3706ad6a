package client

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/metadata"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Client is a connection to a MemoryFS cluster with one session. It is safe
// for concurrent use. The methods that take no context use the Client's
// context (context.Background unless the Client came from WithContext),
// and retry for at most the retry timeout when that context has no
// deadline.
type Client struct {
	k   *core
	ctx context.Context
}

// New connects to the cluster at addrs (any subset of its nodes' API
// addresses, "host:port" or "unix:///path"), finds the leader and opens a
// session, which it keeps alive until Close. ctx bounds only this setup.
func New(ctx context.Context, addrs []string, opts ...Option) (*Client, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	t, err := newTransport(&cfg, addrs)
	if err != nil {
		return nil, err
	}
	k := &core{cfg: cfg, t: t, seqs: newSeqTracker(), done: make(chan struct{})}
	// The status reply names the leader and every member, so a client
	// given only some addresses still reaches all of them.
	st, err := k.status(ctx)
	switch {
	case err == nil:
		t.learn(st)
	case errors.Is(err, ErrUnavailable):
		_ = t.close()
		return nil, err
	}
	s, err := k.openSession(ctx)
	if err != nil {
		_ = t.close()
		return nil, err
	}
	k.sess.Store(s)
	kctx, stop := context.WithCancel(context.Background())
	k.stop = stop
	c := &Client{k: k, ctx: context.Background()}
	if cfg.caps {
		k.caps = newCaps(c)
		go k.caps.run(kctx)
	}
	go k.keepAlive(kctx)
	return c, nil
}

// WithContext returns a Client that shares c's connections and session but
// runs the methods that take no context (and the Files it opens) under
// ctx. Closing either closes both.
func (c *Client) WithContext(ctx context.Context) *Client {
	return &Client{k: c.k, ctx: ctx}
}

// Session returns the id of the client's current session.
func (c *Client) Session() uint64 { return c.k.sess.Load().id }

// Calls counts the calls a client made to the cluster.
type Calls struct {
	Commands int64 // Apply and Write calls: each a command through the log
	Queries  int64 // Query and Read calls
}

// Calls returns how many commands and queries the client has sent, its
// keepalives and capability releases included; a retried call counts
// once.
func (c *Client) Calls() Calls {
	return Calls{Commands: c.k.commands.Load(), Queries: c.k.queries.Load()}
}

// Addrs returns every node address the client knows: those given to New
// and those the cluster reported.
func (c *Client) Addrs() []string { return c.k.t.known() }

// Close ends the session (releasing its open handles and exclusive opens)
// and the connections. It is safe to call more than once.
func (c *Client) Close() error {
	k := c.k
	k.closeOnce.Do(func() {
		k.stop()
		<-k.done
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		cmd := &pb.Command{Op: &pb.Command_CloseSession{CloseSession: &pb.CloseSessionCmd{}}}
		_, err := k.apply(ctx, cmd, 0)
		if errors.Is(err, ErrUnavailable) {
			// The lease will run out on its own.
			err = nil
		}
		k.closeErr = errors.Join(err, k.t.close())
	})
	return k.closeErr
}

// Status reports the cluster's state as a node sees it (the leader when
// one is known): the leader, every node with its Raft state and applied
// index, and the totals of the file system.
func (c *Client) Status(ctx context.Context) (*pb.StatusResponse, error) {
	st, err := c.k.status(ctx)
	if err != nil {
		return nil, err
	}
	c.k.t.learn(st)
	return st, nil
}

func (k *core) status(ctx context.Context) (*pb.StatusResponse, error) {
	var resp *pb.StatusResponse
	_, err := k.t.call(ctx, callOpts{op: "status"}, func(ctx context.Context, api pb.MemFSClient) (metadata.MD, error) {
		r, err := api.Status(ctx, &pb.StatusRequest{Version: pb.Version})
		resp = r
		return nil, err
	})
	return resp, err
}
