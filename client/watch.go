package client

import (
	"context"
	"fmt"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Watch streams the change events of the file system (the inodes and
// directory entries each applied log entry changed) until ctx is done,
// when the channel is closed. The stream comes from one node; when it
// breaks the client reconnects (to the leader when known), and, because
// events may have been missed meanwhile, first delivers an event with
// Index 0 and nothing else in it: a receiver that caches should then drop
// everything it cached. Events are not dropped when the receiver is slow;
// the stream waits for it.
//
// Watch returns once a node has subscribed the stream (so every change
// made after it returns is delivered), or with the error that kept it from
// subscribing in time.
func (c *Client) Watch(ctx context.Context) (<-chan *pb.WatchEvent, error) {
	st, err := c.openWatch(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	ch := make(chan *pb.WatchEvent, 64)
	go c.watchLoop(ctx, st, ch)
	return ch, nil
}

// watchStream is one open Watch stream and what ends it.
type watchStream struct {
	recv   func() (*pb.WatchEvent, error)
	cancel context.CancelFunc
}

func (c *Client) openWatch(ctx context.Context) (watchStream, error) {
	var ws watchStream
	o := callOpts{op: "watch"}
	_, err := c.k.t.call(ctx, o, func(actx context.Context, api pb.MemFSClient) (metadata.MD, error) {
		// The stream outlives the attempt, so it runs on a context of its
		// own; a node that fails after this shows up in recv. Until the
		// node has answered with its header, the attempt's deadline holds.
		sctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(actx, cancel)
		s, err := api.Watch(sctx, &pb.WatchRequest{Version: pb.Version})
		if err == nil {
			// The node sends its header once it has subscribed, so events
			// of changes made after Watch returns are delivered.
			_, err = s.Header()
		}
		if !stop() || err != nil {
			cancel()
			if err == nil {
				err = actx.Err()
			}
			if _, ok := status.FromError(err); !ok {
				err = status.FromContextError(err).Err()
			}
			return nil, err
		}
		ws = watchStream{recv: s.Recv, cancel: cancel}
		return nil, nil
	})
	return ws, err
}

func (c *Client) watchLoop(ctx context.Context, st watchStream, ch chan<- *pb.WatchEvent) {
	defer close(ch)
	for {
		for {
			ev, err := st.recv()
			if err != nil {
				st.cancel()
				if ctx.Err() == nil {
					c.k.cfg.log.Debug("memfs: watch stream broke; reconnecting", "err", err)
				}
				break
			}
			if !deliver(ctx, ch, ev) {
				return
			}
		}
		for {
			if ctx.Err() != nil {
				return
			}
			s, err := c.openWatch(ctx)
			if err == nil {
				st = s
				break
			}
			c.k.cfg.log.Debug("memfs: watch reconnect failed", "err", err)
		}
		if !deliver(ctx, ch, &pb.WatchEvent{}) {
			return
		}
	}
}

func deliver(ctx context.Context, ch chan<- *pb.WatchEvent, ev *pb.WatchEvent) bool {
	select {
	case ch <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}
