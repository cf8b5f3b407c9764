package imageimport

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/containerd/containerd/v2/pkg/archive/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// errUnpacksPast is a budget's refusal: the layers counted so far expand past
// Config.MaxUnpackedBytes. Import turns it into the user's sentence.
var errUnpacksPast = errors.New("the image unpacks past the bound")

// badLayerError is a layer that could not be counted: not gzip, zstd or tar.
type badLayerError struct{ err error }

func (e *badLayerError) Error() string { return e.err.Error() }
func (e *badLayerError) Unwrap() error { return e.err }

// unpackBudget adds up what an image's layers unpack to, against a bound. A
// layer is counted once per digest and weighs as many times as the manifest
// lists it (each listing is applied on unpack); a layer counted again (a
// retried upload) replaces its earlier count.
type unpackBudget struct {
	mu     sync.Mutex
	limit  int64
	total  int64
	layers map[string]*layerCount
}

type layerCount struct {
	n, times int64
	counted  bool
}

func newUnpackBudget(limit int64, digests []string) *unpackBudget {
	b := &unpackBudget{limit: limit, layers: map[string]*layerCount{}}
	for _, d := range digests {
		if b.layers[d] == nil {
			b.layers[d] = &layerCount{}
		}
		b.layers[d].times++
	}
	return b
}

// set records that the layer digest unpacks to n bytes so far;
// errUnpacksPast once the image's total is past the bound.
func (b *unpackBudget) set(digest string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.layers[digest]
	if l == nil { // not one of the manifest's layers: weighs once
		l = &layerCount{times: 1}
		b.layers[digest] = l
	}
	b.total += (n - l.n) * l.times
	l.n = n
	if b.total > b.limit {
		return errUnpacksPast
	}
	return nil
}

// done marks digest as counted to its end.
func (b *unpackBudget) done(digest string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l := b.layers[digest]; l != nil {
		l.counted = true
	}
}

// uncounted returns the layers not counted to their end.
func (b *unpackBudget) uncounted() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ds []string
	for d, l := range b.layers {
		if !l.counted {
			ds = append(ds, d)
		}
	}
	return ds
}

// count reads the layer blob r (gzip, zstd or an uncompressed tar, detected
// as containerd's applier detects it) through a decompressor and reports to
// the budget as it goes, stopping at the first report past the bound. What a
// layer unpacks to is the larger of its tar stream's length and the sum of its
// files' sizes: a sparse file's entry is short in the stream and is written
// out in full (containerd's applier writes the holes as zeros). The stream is
// read to its end, past the tar's end-of-archive, as the applier reads it.
func (b *unpackBudget) count(digest string, r io.Reader) error {
	if err := b.set(digest, 0); err != nil {
		return err
	}
	dr, err := compression.DecompressStream(r)
	if err != nil {
		return &badLayerError{fmt.Errorf("its layer %s does not decompress (%w)", digest, err)}
	}
	defer dr.Close()
	cr := &countingReader{r: dr, report: func(n int64) error { return b.set(digest, n) }}
	tr := tar.NewReader(cr)
	for {
		hdr, err := tr.Next()
		if err != nil {
			break // the end of the archive, or not a tar: the rest counts as bytes
		}
		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeGNUSparse, tar.TypeCont:
			if hdr.Size > 0 {
				cr.files += hdr.Size
				if err := cr.reportNow(); err != nil {
					return err
				}
			}
		}
	}
	if cr.err != nil {
		return cr.err
	}
	if _, err := io.Copy(io.Discard, cr); err != nil {
		if cr.err != nil {
			return cr.err
		}
		return &badLayerError{fmt.Errorf("its layer %s does not decompress (%w)", digest, err)}
	}
	b.done(digest)
	return nil
}

// countingReader counts the bytes read through it and reports the larger of
// that and files after each read; a refused report ends the reading.
type countingReader struct {
	r      io.Reader
	read   int64
	files  int64
	report func(int64) error
	err    error // the report's refusal
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.r.Read(p)
	c.read += int64(n)
	if rerr := c.reportNow(); rerr != nil {
		return n, rerr
	}
	return n, err
}

func (c *countingReader) reportNow() error {
	if c.err == nil {
		c.err = c.report(max(c.read, c.files))
	}
	return c.err
}

// countedImage is an image whose layers are counted against a budget while
// they are read (remote.Write reads each layer's Compressed() once, or again on
// a retry). The manifest and config are the image's own, so its digest is.
type countedImage struct {
	v1.Image
	budget *unpackBudget
	stop   func(error) // cancels the write

	mu  sync.Mutex
	err error // the first count that failed: past the bound, or not a layer
}

func (c *countedImage) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.stop(err)
}

// failed returns the first count's failure, nil when none failed.
func (c *countedImage) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *countedImage) Layers() ([]v1.Layer, error) {
	ls, err := c.Image.Layers()
	if err != nil {
		return nil, err
	}
	out := make([]v1.Layer, len(ls))
	for i, l := range ls {
		out[i] = &countedLayer{Layer: l, img: c}
	}
	return out, nil
}

func (c *countedImage) LayerByDigest(h v1.Hash) (v1.Layer, error) {
	l, err := c.Image.LayerByDigest(h)
	if err != nil {
		return nil, err
	}
	return &countedLayer{Layer: l, img: c}, nil
}

type countedLayer struct {
	v1.Layer
	img *countedImage
}

// Compressed tees the blob into a counter, which decompresses it in a
// goroutine as it is read; the blob's end is handed to the reader only after
// the counter has counted it all, so that an upload never completes with its
// count past the bound.
func (l *countedLayer) Compressed() (io.ReadCloser, error) {
	h, err := l.Digest()
	if err != nil {
		return nil, err
	}
	rc, err := l.Layer.Compressed()
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	t := &teeCount{rc: rc, pw: pw, res: make(chan error, 1)}
	go func() {
		err := l.img.budget.count(h.String(), pr)
		if err != nil && (errors.Is(err, errUnpacksPast) || !t.closed.Load()) {
			l.img.fail(err)
		}
		if err == nil {
			err = io.EOF
		}
		pr.CloseWithError(err) // the tee's writes fail from now on
		t.res <- err
	}()
	return t, nil
}

type teeCount struct {
	rc     io.ReadCloser
	pw     *io.PipeWriter
	res    chan error
	end    error       // what the counter said at the blob's end
	closed atomic.Bool // the upload stopped reading: a retry reopens the layer and counts it again
}

func (t *teeCount) Read(p []byte) (int, error) {
	if t.end != nil {
		return 0, t.end
	}
	n, err := t.rc.Read(p)
	if n > 0 {
		if _, werr := t.pw.Write(p[:n]); werr != nil && werr != io.EOF {
			return 0, werr
		}
	}
	if err == io.EOF {
		t.pw.Close()
		t.end = <-t.res // io.EOF when counted within the bound
		return n, t.end
	}
	return n, err
}

func (t *teeCount) Close() error {
	t.closed.Store(true)
	t.pw.CloseWithError(errors.New("the upload closed the layer"))
	return t.rc.Close()
}
