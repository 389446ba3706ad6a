package heapgoal

import (
	"io"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name           string
		live, headroom uint64
		most, want     int
	}{
		{"empty heap", 0, 256 * mib, DefaultMax, DefaultMax},
		{"live below headroom", 100 * mib, 256 * mib, DefaultMax, DefaultMax},
		{"live equals headroom", 256 * mib, 256 * mib, DefaultMax, DefaultMax},
		{"twice the headroom", 512 * mib, 256 * mib, DefaultMax, 50},
		{"a node holding 1.5 GiB", 1536 * mib, 256 * mib, DefaultMax, 16},
		{"huge heap hits the floor", 64 << 30, 256 * mib, DefaultMax, MinPercent},
		{"a mount's small heap keeps its maximum", 20 * mib, 128 * mib, 400, 400},
		{"a mount's full data cache", 256 * mib, 128 * mib, 400, 50},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, Percent(c.live, c.headroom, c.most))
		})
	}
}

func TestStartOffWithoutHeadroomOrWithGOGC(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	require.Nil(t, Start(0, DefaultMax, log))
	t.Setenv("GOGC", "100")
	require.Nil(t, Start(64<<20, DefaultMax, log))
}

// gogc reads the GC percent the runtime is using.
func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestTunerFollowsLiveHeap holds 64 MiB live with 16 MiB of headroom and
// a maximum of 200: Start must set 200, a collection must bring the
// runtime's percent down to about 25, and Stop must restore the percent
// from before.
func TestTunerFollowsLiveHeap(t *testing.T) {
	t.Setenv("GOGC", "") // whatever the environment running the test says
	live := make([][]byte, 64)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	before := gogc()
	tu := Start(16<<20, 200, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NotNil(t, tu)
	defer tu.Stop()
	require.Equal(t, uint64(200), gogc())
	require.Eventually(t, func() bool {
		runtime.GC()
		return gogc() < 30 && tu.Percent() == int(gogc())
	}, 10*time.Second, 10*time.Millisecond)
	require.GreaterOrEqual(t, gogc(), uint64(MinPercent))
	runtime.KeepAlive(live)
	tu.Stop()
	require.Equal(t, before, gogc())
	runtime.GC()
	require.Equal(t, before, gogc(), "a stopped tuner changes nothing")
}
