package server

import (
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/memoryfs/memfs/memfspb"
)

// watchBuffer is how many events a Watch stream may fall behind before it
// is dropped (the client resubscribes and revalidates its caches).
const watchBuffer = 1024

// watchers fans the state machine's change events out to Watch streams.
// publish runs on the apply goroutine and never blocks.
type watchers struct {
	mu     sync.Mutex
	subs   map[*watcher]struct{} // guarded by mu
	closed bool                  // guarded by mu
}

type watcher struct {
	ch      chan *pb.WatchEvent
	lost    chan struct{} // closed when the watcher is dropped
	reason  codes.Code
	message string
}

func newWatchers() *watchers { return &watchers{subs: map[*watcher]struct{}{}} }

func (ws *watchers) subscribe() *watcher {
	w := &watcher{ch: make(chan *pb.WatchEvent, watchBuffer), lost: make(chan struct{})}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed {
		w.drop(codes.Unavailable, "node is shutting down")
		return w
	}
	ws.subs[w] = struct{}{}
	return w
}

func (ws *watchers) unsubscribe(w *watcher) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	delete(ws.subs, w)
}

// publish is fsm.Config.OnChange.
func (ws *watchers) publish(ev *pb.WatchEvent) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for w := range ws.subs {
		select {
		case w.ch <- ev:
		default:
			delete(ws.subs, w)
			w.drop(codes.ResourceExhausted, "watch fell behind; resubscribe and revalidate")
		}
	}
}

func (ws *watchers) closeAll() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.closed = true
	for w := range ws.subs {
		w.drop(codes.Unavailable, "node is shutting down")
	}
	clear(ws.subs)
}

// drop must be called once, under watchers.mu.
func (w *watcher) drop(code codes.Code, msg string) {
	w.reason, w.message = code, msg
	close(w.lost)
}

func (w *watcher) err() error { return status.Error(w.reason, w.message) }
