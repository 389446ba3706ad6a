package region

import "time"

// startPull starts the background pullers and the progress reports.
func (r *Region) startPull() {
	for range max(r.opts.Workers, 0) {
		r.wg.Add(1)
		go r.puller()
	}
	if r.opts.Progress != nil {
		r.wg.Add(1)
		go r.reporter()
	}
}

// puller fetches missing chunks in priority order until the region is
// whole, then waits for chunks to go missing again (a revalidation).
func (r *Region) puller() {
	defer r.wg.Done()
	per := max(1, maxBatch/max(r.cs, 1))
	for r.ctx.Err() == nil {
		r.mu.Lock()
		claim := r.pick(per)
		wake := r.wake
		r.mu.Unlock()
		if len(claim) == 0 {
			select {
			case <-wake:
			case <-r.ctx.Done():
			}
			continue
		}
		if err := r.fetch(r.ctx, claim); err != nil && r.ctx.Err() == nil {
			select {
			case <-time.After(100 * time.Millisecond):
			case <-r.ctx.Done():
			}
		}
	}
}

// pick claims up to n missing chunks: urgent ones first, then the
// priority's, then any in file order. Chunks that can be filled locally
// are filled on the way.
func (r *Region) pick(n int) []int {
	if r.mem == nil || r.state == stateClosed || r.state == stateHandedOff {
		return nil
	}
	var claim []int
	take := func(i int) {
		c := &r.ch[i]
		if c.present || c.fetching || r.sameInFlight(i) || r.fromLocal(i) {
			return
		}
		r.claim(i)
		claim = append(claim, i)
	}
	for len(claim) < n && len(r.urgent) > 0 {
		i := r.urgent[0]
		r.urgent = r.urgent[1:]
		take(i)
	}
	for len(claim) < n && r.local < len(r.ch) {
		i, ok := r.opts.Priority.Next()
		if !ok {
			break
		}
		if i >= 0 && i < len(r.ch) {
			take(i)
		}
	}
	for len(claim) < n && r.local < len(r.ch) && r.scanAt < len(r.ch) {
		take(r.scanAt)
		r.scanAt++
	}
	if len(claim) == 0 && r.local < len(r.ch) && r.scanAt >= len(r.ch) {
		// Chunks went missing again, or fetches failed: look once more.
		r.scanAt = 0
		for len(claim) < n && r.scanAt < len(r.ch) {
			take(r.scanAt)
			r.scanAt++
		}
	}
	return claim
}

// reporter calls the progress function every ProgressInterval.
func (r *Region) reporter() {
	defer r.wg.Done()
	t := time.NewTicker(r.opts.ProgressInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-r.ctx.Done():
			return
		}
		r.mu.Lock()
		p := r.progressLocked()
		r.lastReport, r.lastPulled, r.lastPushed = time.Now(), r.pulled, r.pushed
		r.mu.Unlock()
		r.opts.Progress(p)
	}
}
