package client_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/server"
)

// BenchmarkCreates creates 4 KiB files with 32 clients against an
// in-process cluster on the default durable store; run it with
// -cpuprofile to see where a create's time goes.
func BenchmarkCreates(b *testing.B) {
	body := make([]byte, 4096)
	perClient(b, func(cl *client.Client, w int, i int64) error {
		return cl.WriteFile(fmt.Sprintf("/c%d/f%d", w, i), body, 0o644)
	})
}

// BenchmarkMkdirs makes directories with 32 clients: one command per
// operation, the baseline a create that took one command would reach.
func BenchmarkMkdirs(b *testing.B) {
	perClient(b, func(cl *client.Client, w int, i int64) error {
		return cl.Mkdir(fmt.Sprintf("/c%d/d%d", w, i), 0o755)
	})
}

// perClient runs b.N operations spread over 32 clients, each with its own
// session and directory /c<worker>.
func perClient(b *testing.B, op func(cl *client.Client, worker int, i int64) error) {
	c := server.StartCluster(b, 3)
	const clients = 32
	cls := make([]*client.Client, clients)
	for i := range cls {
		cl, err := client.New(b.Context(), c.APIAddrs())
		require.NoError(b, err)
		b.Cleanup(func() { _ = cl.Close() })
		require.NoError(b, cl.Mkdir(fmt.Sprintf("/c%d", i), 0o755))
		cls[i] = cl
	}
	var next atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range clients {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := op(cls[w], w, i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkWrite1MiB writes 1 MiB operations with 16 in flight.
func BenchmarkWrite1MiB(b *testing.B) {
	c := server.StartCluster(b, 3)
	cl, err := client.New(b.Context(), c.APIAddrs())
	require.NoError(b, err)
	defer cl.Close()
	f, err := cl.Create("/seq")
	require.NoError(b, err)
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 31)
	}
	var next atomic.Int64
	b.SetBytes(1 << 20)
	b.ResetTimer()
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				buf := append([]byte(nil), buf...)
				buf[0] = byte(i)
				if _, err := f.WriteAt(buf, i<<20); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
