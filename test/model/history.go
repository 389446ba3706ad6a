package model

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Recorder collects the operations of concurrent clients with their
// invocation and response times on one monotonic clock. It is safe for
// concurrent use.
type Recorder struct {
	start time.Time

	mu  sync.Mutex
	ops []porcupine.Operation
}

// NewRecorder starts an empty history whose clock starts now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

func (r *Recorder) now() int64 { return int64(time.Since(r.start)) }

// Call is an invoked operation that has not returned yet.
type Call struct {
	r      *Recorder
	client int
	in     Input
	call   int64
}

// Begin marks the invocation of in by client; call it just before the
// request leaves the client.
func (r *Recorder) Begin(client int, in Input) *Call {
	return &Call{r: r, client: client, in: in, call: r.now()}
}

// End records the operation's response, taken just after it arrived.
func (c *Call) End(out Output) {
	ret := c.r.now()
	if out.Unknown {
		// Porcupine's convention for an operation that may take effect at
		// any later time: it never returns.
		ret = math.MaxInt64
	}
	c.r.add(porcupine.Operation{ClientId: c.client, Input: c.in, Call: c.call, Output: out, Return: ret})
}

// Discard forgets the call: only for reads that failed, which constrain
// nothing.
func (c *Call) Discard() {}

// Invoked is when the call was invoked, on the recorder's clock (Now).
func (c *Call) Invoked() int64 { return c.call }

// Now is the recorder's clock: nanoseconds since the history began.
func (r *Recorder) Now() int64 { return r.now() }

// Held is an operation whose response has arrived but which is kept out
// of the history until its outcome is settled: the answer of a client
// that acknowledges changes before the cluster has them (a buffering
// mount), which a crash or a revoked capability can still take back.
type Held struct {
	c   *Call
	out Output
	ret int64
}

// Hold takes the response now, with its return time, and records
// nothing yet: Confirm or Void decides how it enters the history.
func (c *Call) Hold(out Output) *Held { return &Held{c: c, out: out, ret: c.r.now()} }

// Invoked is when the held call was invoked, on the recorder's clock.
func (h *Held) Invoked() int64 { return h.c.call }

// Confirm records the operation as it returned, at the time it returned:
// its outcome is known to stand.
func (h *Held) Confirm() {
	if h.out.Unknown {
		h.c.End(h.out)
		return
	}
	h.c.r.add(porcupine.Operation{ClientId: h.c.client, Input: h.c.in, Call: h.c.call, Output: h.out, Return: h.ret})
}

// Void records the operation as of unknown outcome, since what it
// answered may never have reached the cluster: a change may or may not
// have taken effect (porcupine's convention, as End with Unknown), and a
// read, whose answer may rest on such changes, is left out: it then
// constrains nothing.
func (h *Held) Void() {
	if h.c.in.Kind.IsRead() {
		return
	}
	h.c.End(Output{Unknown: true})
}

func (r *Recorder) add(op porcupine.Operation) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// Operations returns a copy of the history so far.
func (r *Recorder) Operations() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]porcupine.Operation(nil), r.ops...)
}

// Counts summarises a history: operations, those with unknown outcome,
// and keys (porcupine partitions).
type Counts struct {
	Ops, Unknown, Keys int
}

// Count summarises ops.
func Count(ops []porcupine.Operation) Counts {
	keys := map[string]bool{}
	c := Counts{Ops: len(ops)}
	for _, op := range ops {
		keys[op.Input.(Input).Key] = true
		if op.Output.(Output).Unknown {
			c.Unknown++
		}
	}
	c.Keys = len(keys)
	return c
}

// savedOp is the JSON form of one operation.
type savedOp struct {
	Client int    `json:"client"`
	Call   int64  `json:"call"`
	Return int64  `json:"return"`
	Input  Input  `json:"input"`
	Output Output `json:"output"`
}

// SaveHistory writes ops as JSON to path.
func SaveHistory(path string, ops []porcupine.Operation) error {
	out := make([]savedOp, len(ops))
	for i, op := range ops {
		out[i] = savedOp{op.ClientId, op.Call, op.Return, op.Input.(Input), op.Output.(Output)}
	}
	b, err := json.MarshalIndent(out, "", " ")
	if err != nil {
		return fmt.Errorf("encode history: %w", err)
	}
	return os.WriteFile(path, b, 0o644)
}

// LoadHistory reads a history written by SaveHistory.
func LoadHistory(path string) ([]porcupine.Operation, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var in []savedOp
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("decode history %s: %w", path, err)
	}
	ops := make([]porcupine.Operation, len(in))
	for i, op := range in {
		ops[i] = porcupine.Operation{ClientId: op.Client, Call: op.Call, Return: op.Return, Input: op.Input, Output: op.Output}
	}
	return ops, nil
}

// OutDir is where a test keeps what must outlive it (a violating history
// and its visualisation): $MEMFS_TEST_OUT or the system temp directory,
// never t.TempDir(), which is deleted when the test ends.
func OutDir(testName string, seed int64) (string, error) {
	root := os.Getenv("MEMFS_TEST_OUT")
	if root == "" {
		root = filepath.Join(os.TempDir(), "memfs-test-out")
	}
	safe := regexp.MustCompile(`[^A-Za-z0-9_.-]+`).ReplaceAllString(testName, "_")
	dir := filepath.Join(root, fmt.Sprintf("%s-seed%d-%d", safe, seed, time.Now().UnixNano()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("output dir: %w", err)
	}
	return dir, nil
}
