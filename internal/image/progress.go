package image

import (
	"io"
	"sync"
)

// Progress reports a pull. Total and Done count the compressed bytes of
// all layers that must be downloaded (cached layers are not counted), so a
// progress bar can be drawn from them alone. Updates about one layer also
// name it (the first 12 hex digits of its digest) and carry its own counts.
type Progress struct {
	Total, Done int64  // bytes, over the whole image
	Layer       string // the layer this update is about; "" for the image as a whole
	Status      string // one of the Status* constants
	LayerTotal  int64  // bytes of this layer (compressed; 0 if unknown)
	LayerDone   int64  // bytes of this layer downloaded so far
}

// Progress statuses, in the order a pull goes through them.
const (
	StatusResolving   = "Resolving"      // asking the registry what the reference points to
	StatusExists      = "Already exists" // layer: cached, nothing to download
	StatusDownloading = "Downloading"    // layer: downloading and unpacking (streamed together)
	StatusComplete    = "Pull complete"  // layer: unpacked and verified
	StatusDone        = "Done"           // image: everything is in place
)

// reportEvery throttles per-layer updates to one per this many bytes.
const reportEvery = 128 << 10

// reporter serializes calls to the user's callback (layers download in
// parallel) and keeps the image-wide counts.
type reporter struct {
	mu          sync.Mutex
	fn          func(Progress)
	total, done int64
}

func (r *reporter) send(p Progress) {
	if r == nil || r.fn == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p.Total, p.Done = r.total, r.done
	r.fn(p)
}

// add moves the image-wide counts; the next send reports them.
func (r *reporter) add(total, done int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.total += total
	r.done += done
	r.mu.Unlock()
}

// countingReader feeds a layer's download into the reporter.
type countingReader struct {
	r       io.Reader
	rep     *reporter
	layer   string
	size    int64
	n, last int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.n += int64(n)
		c.rep.add(0, int64(n))
		if c.n-c.last >= reportEvery || c.n == c.size {
			c.last = c.n
			c.rep.send(Progress{Layer: c.layer, Status: StatusDownloading, LayerTotal: c.size, LayerDone: c.n})
		}
	}
	return n, err
}
