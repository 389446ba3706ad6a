package opsweb

import (
	"math"
	"sort"
	"time"

	"github.com/memoryfs/memfs/internal/promstat"
	pb "github.com/memoryfs/memfs/memfspb"
)

// The page's rates are the cluster's, whichever node serves it: every
// member reports its latency histograms since it started in its Status
// answer (commands it applied as leader, queries it answered), and two
// readings of a member give what it did in between. Summed over the
// members, commands count once each (only a leader applies them, and a
// change of leader inside the window moves the count from one member to
// the other), and reads count once per node that answered them.

// reading is what each member that answered reported at one time.
type reading struct {
	at    time.Time
	nodes map[string]nodeOps
}

// nodeOps is one member's histograms by operation name.
type nodeOps struct {
	commands map[string]promstat.Hist
	reads    map[string]promstat.Hist
}

// readingOf keeps what st's members reported, leaving out those that
// did not answer and any histogram that does not hold together.
func readingOf(at time.Time, st *pb.StatusResponse) reading {
	r := reading{at: at, nodes: map[string]nodeOps{}}
	for _, n := range st.GetNodes() {
		if n.GetError() != "" {
			continue
		}
		r.nodes[n.GetId()] = nodeOps{commands: histsOf(n.GetCommandLatency()), reads: histsOf(n.GetReadLatency())}
	}
	return r
}

func histsOf(ls []*pb.OpLatency) map[string]promstat.Hist {
	out := map[string]promstat.Hist{}
	for _, l := range ls {
		if h, ok := histOf(l); ok {
			out[l.GetName()] = h
		}
	}
	return out
}

// histOf converts a member's histogram; ok is false when it is not one
// (bounds not finite, non-negative and ascending, counts not cumulative,
// more counted in a bucket than in all): a peer's answer is not trusted.
func histOf(l *pb.OpLatency) (promstat.Hist, bool) {
	ups, cum := l.GetUpperBounds(), l.GetCumulativeCounts()
	if len(ups) == 0 || len(ups) != len(cum) || math.IsNaN(l.GetSumSeconds()) || math.IsInf(l.GetSumSeconds(), 0) {
		return promstat.Hist{}, false
	}
	h := promstat.Hist{Count: float64(l.GetCount()), Sum: l.GetSumSeconds(),
		Uppers: make([]float64, len(ups)), Cumulative: make([]float64, len(cum))}
	for i := range ups {
		if math.IsNaN(ups[i]) || math.IsInf(ups[i], 0) || ups[i] < 0 || (i > 0 && ups[i] <= ups[i-1]) ||
			(i > 0 && cum[i] < cum[i-1]) || cum[i] > l.GetCount() {
			return promstat.Hist{}, false
		}
		h.Uppers[i], h.Cumulative[i] = ups[i], float64(cum[i])
	}
	return h, true
}

// clusterOps is the rate and p99 of every operation over readings
// (oldest first), and each member's operations per second. Each member
// counts between the first and the last reading it answered in.
func clusterOps(readings []reading) (commands, reads []OpStat, perNode map[string]float64) {
	perNode = map[string]float64{}
	cmd, rd := opSums{}, opSums{}
	if len(readings) < 2 {
		return []OpStat{}, []OpStat{}, perNode
	}
	last := readings[len(readings)-1]
	for id, now := range last.nodes {
		var first *reading
		for i := range readings[:len(readings)-1] {
			if _, ok := readings[i].nodes[id]; ok {
				first = &readings[i]
				break
			}
		}
		if first == nil {
			continue
		}
		secs := last.at.Sub(first.at).Seconds()
		if secs <= 0 {
			continue
		}
		was := first.nodes[id]
		perNode[id] = cmd.add(now.commands, was.commands, secs) + rd.add(now.reads, was.reads, secs)
	}
	return cmd.stats(), rd.stats(), perNode
}

// opSums adds up the members' rates and histograms by operation name.
type opSums map[string]*opSum

type opSum struct {
	perSecond float64
	hist      promstat.Hist
	mixed     bool // members with other buckets: no p99
}

// add counts one member's operations between was and now over secs and
// returns its operations per second.
func (s opSums) add(now, was map[string]promstat.Hist, secs float64) float64 {
	total := 0.0
	for name, h := range now {
		d := h.Since(was[name])
		if d.Count == 0 {
			continue
		}
		o := s[name]
		if o == nil {
			o = &opSum{}
			s[name] = o
		}
		o.perSecond += d.Count / secs
		total += d.Count / secs
		var ok bool
		if o.hist, ok = o.hist.Add(d); !ok {
			o.mixed = true
		}
	}
	return total
}

// stats lists the sums busiest first.
func (s opSums) stats() []OpStat {
	out := []OpStat{}
	for name, o := range s {
		st := OpStat{Name: name, PerSecond: o.perSecond}
		if q := o.hist.Quantile(0.99); !o.mixed && !math.IsNaN(q) {
			st.P99 = &q
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PerSecond != out[j].PerSecond {
			return out[i].PerSecond > out[j].PerSecond
		}
		return out[i].Name < out[j].Name
	})
	return out
}
