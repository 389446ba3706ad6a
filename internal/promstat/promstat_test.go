package promstat

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/require"
)

func TestQuantile(t *testing.T) {
	h := Hist{Uppers: []float64{1, 2, 4}, Cumulative: []float64{10, 30, 40}, Count: 50}
	cases := []struct {
		name string
		h    Hist
		q    float64
		want float64
	}{
		{"inside the first bucket, from 0", h, 0.1, 0.5},
		{"middle of the second bucket", h, 0.4, 1.5},
		{"upper edge of a bucket", h, 0.6, 2},
		{"in +Inf: the highest finite bound", h, 0.99, 4},
		{"empty", Hist{Uppers: []float64{1}, Cumulative: []float64{0}}, 0.5, math.NaN()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.h.Quantile(tc.q)
			if math.IsNaN(tc.want) {
				require.True(t, math.IsNaN(got), "got %v", got)
				return
			}
			require.InDelta(t, tc.want, got, 1e-9)
		})
	}
}

func TestRatesAndQuantilesBetweenReadings(t *testing.T) {
	reg := prometheus.NewRegistry()
	ops := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ops_total", Help: "h"}, []string{"type", "errno"})
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "lat_seconds", Help: "h",
		Buckets: []float64{0.001, 0.01, 0.1}}, []string{"type"})
	reg.MustRegister(ops, lat)
	for range 100 {
		lat.WithLabelValues("read").Observe(0.5) // before the window: must not count
	}
	prev, err := Take(reg)
	require.NoError(t, err)
	ops.WithLabelValues("write", "0").Add(20)
	ops.WithLabelValues("write", "28").Add(10) // errno is summed away
	ops.WithLabelValues("read", "0").Add(5)
	for range 99 {
		lat.WithLabelValues("read").Observe(0.0005)
	}
	lat.WithLabelValues("read").Observe(0.05)
	cur, err := Take(reg)
	require.NoError(t, err)
	cur.At = prev.At.Add(10 * time.Second) // the readings' own times set the rate

	r := Rates(prev, cur, "ops_total", "type")
	require.InDelta(t, 3.0, r["write"], 1e-9)
	require.InDelta(t, 0.5, r["read"], 1e-9)

	d := cur.Histograms("lat_seconds", "type")["read"].Since(prev.Histograms("lat_seconds", "type")["read"])
	require.EqualValues(t, 100, d.Count)
	require.Less(t, d.Quantile(0.5), 0.001, "the old slow reads are outside the window")
	require.Greater(t, d.Quantile(0.995), 0.01)

	// The text a /metrics endpoint serves reads the same.
	var text strings.Builder
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		_, err := expfmt.MetricFamilyToText(&text, f)
		require.NoError(t, err)
	}
	parsed, err := Parse(strings.NewReader(text.String()), cur.At)
	require.NoError(t, err)
	require.Equal(t, cur.Values("ops_total", "type"), parsed.Values("ops_total", "type"))
	require.Equal(t, cur.Histograms("lat_seconds", "type"), parsed.Histograms("lat_seconds", "type"))
}

func TestAddHistograms(t *testing.T) {
	a := Hist{Count: 10, Sum: 1, Uppers: []float64{1, 2}, Cumulative: []float64{4, 8}}
	b := Hist{Count: 5, Sum: 2, Uppers: []float64{1, 2}, Cumulative: []float64{1, 5}}
	sum, ok := a.Add(b)
	require.True(t, ok)
	require.Equal(t, Hist{Count: 15, Sum: 3, Uppers: []float64{1, 2}, Cumulative: []float64{5, 13}}, sum)
	require.Equal(t, []float64{4, 8}, a.Cumulative, "the operands stay as they were")

	sum, ok = Hist{}.Add(b)
	require.True(t, ok, "an empty sum takes the buckets of the first histogram")
	require.Equal(t, b, sum)
	sum.Cumulative[0] = 99
	require.Equal(t, 1.0, b.Cumulative[0], "and copies its counts")

	other := Hist{Count: 1, Uppers: []float64{1, 3}, Cumulative: []float64{0, 1}}
	sum, ok = a.Add(other)
	require.False(t, ok, "other buckets cannot be added")
	require.Equal(t, a, sum)
}
