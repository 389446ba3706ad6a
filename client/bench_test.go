package client_test

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/servertest"
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
	c := servertest.StartCluster(b, 3)
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
	c := servertest.StartCluster(b, 3)
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

// BenchmarkRecall measures what a write costs when another session holds
// a capability on the file: "none" with no holder, "live" with a holder
// that answers the recall (it grants the file again before each write),
// "dead" with a holder that never answers (lease 1 s). It reports the
// writes' p50 and p99.
func BenchmarkRecall(b *testing.B) {
	for _, holder := range []string{"none", "live", "dead"} {
		b.Run(holder, func(b *testing.B) {
			c := servertest.StartCluster(b, 3)
			ctx := b.Context()
			opts := []client.Option{client.WithCaps()}
			if holder == "dead" {
				opts = []client.Option{client.WithLease(time.Second)}
			}
			h, err := client.New(ctx, c.APIAddrs(), opts...)
			require.NoError(b, err)
			defer h.Close()
			w, err := client.New(ctx, c.APIAddrs())
			require.NoError(b, err)
			defer w.Close()
			ino := putIno(b, w, "/f", "x")
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				switch holder {
				case "live":
					_, err = h.Caps().Grant(ctx, []uint64{ino}, false)
				case "dead":
					_, err = h.Do(ctx, &pb.Command{Op: &pb.Command_Grant{Grant: &pb.GrantCmd{Inos: []uint64{ino}}}})
				}
				require.NoError(b, err)
				b.StartTimer()
				start := time.Now()
				_, _, err = w.WriteIno(ctx, ino, 0, []byte("y"))
				lat = append(lat, time.Since(start))
				require.NoError(b, err)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
