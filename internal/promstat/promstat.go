// Package promstat turns two readings of Prometheus metrics into what an
// operator watches: rates of counters and quantiles of histograms over the
// time between the readings, per value of one label. The status page reads
// its node's registry this way and `memfs top` reads nodes' /metrics.
//
// It only reads the families it is given: it must never register, change
// or export metrics.
package promstat

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Snapshot is one reading of every metric family.
type Snapshot struct {
	At       time.Time
	Families map[string]*dto.MetricFamily
}

// Take reads g now.
func Take(g prometheus.Gatherer) (Snapshot, error) {
	fams, err := g.Gather()
	if err != nil {
		return Snapshot{}, fmt.Errorf("gather metrics: %w", err)
	}
	s := Snapshot{At: time.Now(), Families: map[string]*dto.MetricFamily{}}
	for _, f := range fams {
		s.Families[f.GetName()] = f
	}
	return s, nil
}

// Parse reads the Prometheus text format (a /metrics answer) taken at at.
func Parse(r io.Reader, at time.Time) (Snapshot, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Snapshot{}, fmt.Errorf("parse metrics: %w", err)
	}
	return Snapshot{At: at, Families: fams}, nil
}

// labelValue is m's value of label name ("" when it has none).
func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Values sums the counter, gauge or untyped series of family name by
// their value of label ("" groups everything).
func (s Snapshot) Values(name, label string) map[string]float64 {
	out := map[string]float64{}
	f := s.Families[name]
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		var v float64
		switch {
		case m.Counter != nil:
			v = m.GetCounter().GetValue()
		case m.Gauge != nil:
			v = m.GetGauge().GetValue()
		case m.Untyped != nil:
			v = m.GetUntyped().GetValue()
		default:
			continue
		}
		out[labelValue(m, label)] += v
	}
	return out
}

// Hist is one histogram: cumulative counts at each upper bound.
type Hist struct {
	Count      float64
	Sum        float64
	Uppers     []float64 // ascending; +Inf is implied by Count
	Cumulative []float64 // observations <= Uppers[i]
}

// Histograms sums the histograms of family name by their value of label.
func (s Snapshot) Histograms(name, label string) map[string]Hist {
	out := map[string]Hist{}
	f := s.Families[name]
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		h := m.GetHistogram()
		if h == nil {
			continue
		}
		k := labelValue(m, label)
		acc, ok := out[k]
		if !ok {
			for _, b := range h.GetBucket() {
				if !math.IsInf(b.GetUpperBound(), 1) {
					acc.Uppers = append(acc.Uppers, b.GetUpperBound())
				}
			}
			acc.Cumulative = make([]float64, len(acc.Uppers))
		}
		acc.Count += float64(h.GetSampleCount())
		acc.Sum += h.GetSampleSum()
		for i, b := range h.GetBucket() {
			if i < len(acc.Cumulative) && b.GetUpperBound() == acc.Uppers[i] {
				acc.Cumulative[i] += float64(b.GetCumulativeCount())
			}
		}
		out[k] = acc
	}
	return out
}

// Since is h minus an earlier reading of the same histogram: the
// observations made in between. A reset (a restarted process) gives h.
func (h Hist) Since(prev Hist) Hist {
	if prev.Count > h.Count || len(prev.Cumulative) != len(h.Cumulative) {
		return h
	}
	d := Hist{Count: h.Count - prev.Count, Sum: h.Sum - prev.Sum, Uppers: h.Uppers,
		Cumulative: make([]float64, len(h.Cumulative))}
	for i := range h.Cumulative {
		d.Cumulative[i] = h.Cumulative[i] - prev.Cumulative[i]
	}
	return d
}

// Add is the observations of h and o together (two nodes' histograms of
// one operation); ok is false, and the result h, when their buckets
// differ. An empty h takes o's buckets.
func (h Hist) Add(o Hist) (sum Hist, ok bool) {
	if h.Count == 0 && len(h.Uppers) == 0 {
		return Hist{Count: o.Count, Sum: o.Sum, Uppers: o.Uppers, Cumulative: slices.Clone(o.Cumulative)}, true
	}
	if !slices.Equal(h.Uppers, o.Uppers) || len(h.Cumulative) != len(o.Cumulative) {
		return h, false
	}
	sum = Hist{Count: h.Count + o.Count, Sum: h.Sum + o.Sum, Uppers: h.Uppers,
		Cumulative: make([]float64, len(h.Cumulative))}
	for i := range h.Cumulative {
		sum.Cumulative[i] = h.Cumulative[i] + o.Cumulative[i]
	}
	return sum, true
}

// Quantile estimates the q-quantile (0 < q < 1) as Prometheus's
// histogram_quantile does: linearly inside the bucket that holds it, the
// lowest bucket starting at 0, and the highest finite bound when it falls
// in +Inf. NaN when h holds no observation.
func (h Hist) Quantile(q float64) float64 {
	if h.Count == 0 || len(h.Uppers) == 0 {
		return math.NaN()
	}
	rank := q * h.Count
	i := sort.Search(len(h.Cumulative), func(i int) bool { return h.Cumulative[i] >= rank })
	if i == len(h.Cumulative) {
		return h.Uppers[len(h.Uppers)-1]
	}
	lo, below := 0.0, 0.0
	if i > 0 {
		lo, below = h.Uppers[i-1], h.Cumulative[i-1]
	}
	in := h.Cumulative[i] - below
	if in == 0 {
		return h.Uppers[i]
	}
	return lo + (h.Uppers[i]-lo)*(rank-below)/in
}

// Rates is the per-second increase of family name's counters between
// prev and cur, by label value; a counter that went down (a restart)
// counts from 0.
func Rates(prev, cur Snapshot, name, label string) map[string]float64 {
	out := map[string]float64{}
	secs := cur.At.Sub(prev.At).Seconds()
	if secs <= 0 {
		return out
	}
	was := prev.Values(name, label)
	for k, v := range cur.Values(name, label) {
		d := v - was[k]
		if d < 0 {
			d = v
		}
		out[k] = d / secs
	}
	return out
}
