package files

import (
	"encoding/binary"
	"io"
)

// A put's input reaches the helper in chunks, each a 4-byte big-endian
// length and that many bytes, ended by a chunk of length zero. Why not
// the plain bytes to EOF: a stdin that ends early (the server's connection
// to the sandbox broke, or a fork took the helper with it mid-upload and
// its copy has nobody sending) would look like a complete file, and a cut
// file would replace a whole one. Without the end chunk nothing is written.

// maxChunk bounds a chunk a ChunkReader accepts.
const maxChunk = 16 << 20

// ChunkWriter frames what is written to it; Close sends the end.
type ChunkWriter struct {
	w   io.Writer
	hdr [4]byte
}

// NewChunkWriter frames writes to w.
func NewChunkWriter(w io.Writer) *ChunkWriter { return &ChunkWriter{w: w} }

func (c *ChunkWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), maxChunk)
		binary.BigEndian.PutUint32(c.hdr[:], uint32(k))
		if _, err := c.w.Write(c.hdr[:]); err != nil {
			return n, err
		}
		m, err := c.w.Write(p[:k])
		n += m
		if err != nil {
			return n, err
		}
		p = p[k:]
	}
	return n, nil
}

// Close writes the end chunk (it does not close the writer underneath).
func (c *ChunkWriter) Close() error {
	binary.BigEndian.PutUint32(c.hdr[:], 0)
	_, err := c.w.Write(c.hdr[:])
	return err
}

// ChunkReader reads what a ChunkWriter framed; it gives io.EOF only after
// the end chunk, and a CodeShortBody error for an input that stops before.
type ChunkReader struct {
	r    io.Reader
	left uint32
	done bool
}

// NewChunkReader reads framed input from r.
func NewChunkReader(r io.Reader) *ChunkReader { return &ChunkReader{r: r} }

func (c *ChunkReader) Read(p []byte) (int, error) {
	if c.done {
		return 0, io.EOF
	}
	for c.left == 0 {
		var hdr [4]byte
		if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
			return 0, fail(CodeShortBody, "the upload was cut short (%v): nothing more was written", err)
		}
		c.left = binary.BigEndian.Uint32(hdr[:])
		if c.left == 0 {
			c.done = true
			return 0, io.EOF
		}
		if c.left > maxChunk {
			return 0, fail(CodeShortBody, "a chunk of the upload says it is %d bytes: at most %d", c.left, maxChunk)
		}
	}
	if uint32(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= uint32(n)
	if err == io.EOF {
		if c.left > 0 || n == 0 {
			return n, fail(CodeShortBody, "the upload was cut short: nothing more was written")
		}
		err = nil
	}
	return n, err
}
