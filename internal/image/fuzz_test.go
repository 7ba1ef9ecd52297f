package image

// Fuzz targets for every decoder of untrusted input in this package: layer
// tars, image archives (OCI layout, docker save), manifests, indexes and
// configs. Each asserts that nothing panics, that nothing is written outside
// the directory given (a sibling canary file and dir must stay as they
// were, and no hard link may reach them), that no device node is created,
// and that errors are errors that name no host path.
//
// Seed corpora are in testdata/fuzz/<FuzzName>/ (written by
// TestWriteFuzzSeeds when SHARD_WRITE_FUZZ_SEEDS=1). Run one with e.g.
//
//	go test -run '^$' -fuzz '^FuzzUnpackLayer$' -fuzztime 5s ./internal/image/

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"github.com/useshards/shard/internal/hostdisk"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// maxFuzzBytes is the store's bound (Options.MaxImageSize) in every fuzz
// run: what one input may make the unpacker read and write, as the
// server bounds an image (decompressed tar streams, file content with
// sparse files at their full size, an upload). The fuzzer writes to a real
// disk; inputs are not filtered by size, so bombs meet the real bound.
const maxFuzzBytes = 16 << 20

// fuzzBudget is a budget of maxFuzzBytes for unpacking into dir.
func fuzzBudget(dir string) *budget {
	s := &Store{dir: dir, maxImage: maxFuzzBytes, disk: hostdisk.Roomy(dir), log: slog.New(slog.DiscardHandler)}
	return s.newBudget(`image "fuzz"`, false)
}

// sandbox is a temp dir holding the target dir of one fuzz run and, next
// to it, a canary file and a canary dir that nothing may touch.
type sandbox struct {
	base, target string
	canaryIno    uint64
}

const canaryText = "canary"

func newSandbox(t *testing.T) *sandbox {
	base := t.TempDir()
	sb := &sandbox{base: base, target: filepath.Join(base, "target")}
	if err := os.Mkdir(sb.target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "canary"), []byte(canaryText), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(base, "outside"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "outside", "victim"), []byte(canaryText), 0o644); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(base, "canary"), &st); err != nil {
		t.Fatal(err)
	}
	sb.canaryIno = st.Ino
	return sb
}

// check fails the run if anything outside the target changed, a hard link
// inside it reaches the canary, or a device node exists inside it.
func (sb *sandbox) check(t *testing.T) {
	t.Helper()
	ents, _ := os.ReadDir(sb.base)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "canary,outside,target" {
		t.Fatalf("written outside the target: the dir around it holds %v", names)
	}
	if b, err := os.ReadFile(filepath.Join(sb.base, "canary")); err != nil || string(b) != canaryText {
		t.Fatalf("canary changed: %q, %v", b, err)
	}
	if ents, _ := os.ReadDir(filepath.Join(sb.base, "outside")); len(ents) != 1 {
		t.Fatalf("written outside the target: outside/ holds %d entries", len(ents))
	}
	if b, err := os.ReadFile(filepath.Join(sb.base, "outside", "victim")); err != nil || string(b) != canaryText {
		t.Fatalf("outside/victim changed: %q, %v", b, err)
	}
	filepath.WalkDir(sb.target, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		if st.Ino == sb.canaryIno && st.Mode&unix.S_IFMT == unix.S_IFREG {
			t.Fatalf("%s is a hard link to the canary outside", p)
		}
		if ifmt := st.Mode & unix.S_IFMT; ifmt == unix.S_IFBLK || (ifmt == unix.S_IFCHR && st.Rdev != 0) {
			t.Fatalf("device node created on the host: %s", p)
		}
		return nil
	})
}

func checkErr(t *testing.T, err error, hidden ...string) {
	t.Helper()
	if err == nil {
		return
	}
	msg := err.Error()
	if msg == "" {
		t.Fatalf("error with no text: %#v", err)
	}
	for _, h := range hidden {
		if strings.Contains(msg, h) {
			t.Fatalf("error names the host path %s: %s", h, msg)
		}
	}
}

func FuzzUnpackLayer(f *testing.F) {
	for _, s := range layerSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sb := newSandbox(t)
		b := fuzzBudget(sb.target)
		got, err := unpackLayer(own(), &budgetReader{r: bytes.NewReader(data), b: b}, sb.target, b, "", func(string, ...any) {})
		sb.check(t)
		checkErr(t, err, sb.base)
		if err != nil {
			return
		}
		if got.size > maxFuzzBytes {
			t.Fatalf("%d bytes of content unpacked, over the bound of %d", got.size, maxFuzzBytes)
		}
		if len(got.devices) > maxLayerDevices {
			t.Fatalf("%d devices recorded", len(got.devices))
		}
		for _, d := range got.devices {
			if !strings.HasPrefix(d.Path, "/") || filepath.Clean(d.Path) != d.Path || strings.Contains(d.Path, "/../") {
				t.Fatalf("device path %q", d.Path)
			}
			if _, err := os.Lstat(filepath.Join(sb.target, d.Path)); !os.IsNotExist(err) {
				t.Fatalf("device %s: something is on disk at its path (err=%v)", d.Path, err)
			}
		}
	})
}

// importFuzz imports an archive into a new store under a sandbox and
// checks what came of it.
func importFuzz(t *testing.T, archive []byte) {
	sb := newSandbox(t)
	s, err := Open(Options{Dir: sb.target, MaxImageSize: maxFuzzBytes, Disk: hostdisk.Roomy(sb.target)})
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := s.ImportStream(own(), bytes.NewReader(archive), "fuzz/image:1")
	sb.check(t)
	checkErr(t, err, sb.base)
	if err != nil {
		// Nothing of a failed import is left: no layer, blob or spool.
		for _, d := range []string{"l", "blobs/sha256", "tmp"} {
			if ents, _ := os.ReadDir(filepath.Join(sb.target, d)); len(ents) != 0 {
				t.Fatalf("a failed import left %d entries in %s/ (%v)", len(ents), d, err)
			}
		}
		return
	}
	if imgs[0].Size > maxFuzzBytes {
		t.Fatalf("image of %d bytes imported, over the bound of %d", imgs[0].Size, maxFuzzBytes)
	}
	if len(imgs) != 1 {
		t.Fatalf("%d images", len(imgs))
	}
	for _, l := range imgs[0].Layers {
		if !strings.HasPrefix(l, filepath.Join(sb.target, "l")+"/") {
			t.Fatalf("layer dir %s", l)
		}
		if _, err := os.Lstat(l); err != nil {
			t.Fatal(err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(sb.target, "tmp")); len(ents) != 0 {
		t.Fatalf("tmp/ keeps %d entries", len(ents))
	}
}

// FuzzImportArchive feeds raw bytes as an upload: the sniffing of the
// archive kind, gzip, the outer tar, and whatever is inside.
func FuzzImportArchive(f *testing.F) {
	for _, s := range archiveSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		importFuzz(t, data)
	})
}

// Placeholders in the fuzzed documents of FuzzImportOCILayout and
// FuzzImportDockerArchive, replaced by the digests and sizes of the
// fuzzed blobs so that mutations get past the lookups by digest.
const (
	phLayer      = "@LAYER@"
	phLayerSize  = "@LAYERSIZE@"
	phConfig     = "@CONFIG@"
	phConfigSize = "@CONFIGSIZE@"
	phManifest   = "@MANIFEST@"
	phManSize    = "@MANIFESTSIZE@"
)

func sha(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func fill(doc []byte, kv ...string) []byte {
	for i := 0; i < len(kv); i += 2 {
		doc = bytes.ReplaceAll(doc, []byte(kv[i]), []byte(kv[i+1]))
	}
	return doc
}

// ociLayoutTar makes an OCI layout tarball of one image from its
// documents, placeholders filled.
func ociLayoutTar(t testing.TB, index, manifest, config, layer []byte) []byte {
	config = fill(config, phLayer, "sha256:"+sha(layer))
	manifest = fill(manifest, phLayer, "sha256:"+sha(layer), phLayerSize, fmt.Sprint(len(layer)),
		phConfig, "sha256:"+sha(config), phConfigSize, fmt.Sprint(len(config)))
	index = fill(index, phManifest, "sha256:"+sha(manifest), phManSize, fmt.Sprint(len(manifest)))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, b []byte) {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
		tw.Write(b)
	}
	add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	add("index.json", index)
	add("blobs/sha256/"+sha(manifest), manifest)
	add("blobs/sha256/"+sha(config), config)
	add("blobs/sha256/"+sha(layer), layer)
	tw.Close()
	return buf.Bytes()
}

// FuzzImportOCILayout fuzzes the documents of an OCI layout (index.json,
// a manifest or a nested index, a config) and its layer.
func FuzzImportOCILayout(f *testing.F) {
	for _, s := range ociSeeds(f) {
		f.Add(s.index, s.manifest, s.config, s.layer)
	}
	f.Fuzz(func(t *testing.T, index, manifest, config, layer []byte) {
		importFuzz(t, ociLayoutTar(t, index, manifest, config, layer))
	})
}

// dockerArchiveTar makes a docker-save tarball: manifest.json naming
// config.json and layer.tar.
func dockerArchiveTar(t testing.TB, manifest, config, layer []byte) []byte {
	config = fill(config, phLayer, "sha256:"+sha(layer))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, b []byte) {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
		tw.Write(b)
	}
	add("config.json", config)
	add("layer.tar", layer)
	add("manifest.json", manifest)
	tw.Close()
	return buf.Bytes()
}

// FuzzImportDockerArchive fuzzes a docker-save archive's manifest.json,
// config and layer.
func FuzzImportDockerArchive(f *testing.F) {
	for _, s := range dockerSeeds(f) {
		f.Add(s.manifest, s.config, s.layer)
	}
	f.Fuzz(func(t *testing.T, manifest, config, layer []byte) {
		importFuzz(t, dockerArchiveTar(t, manifest, config, layer))
	})
}

// FuzzImageConfig fuzzes an image config through install and commit (what
// a pull or an import does once the layers are there), here with no layers.
func FuzzImageConfig(f *testing.F) {
	for _, s := range configSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, config []byte) {
		sb := newSandbox(t)
		s, err := Open(Options{Dir: sb.target, MaxImageSize: maxFuzzBytes, Disk: hostdisk.Roomy(sb.target)})
		if err != nil {
			t.Fatal(err)
		}
		in, err := s.install(own(), &source{what: "fuzz", config: config}, nil)
		if err == nil {
			_, err = s.commit([]string{"index.docker.io/fuzz/image:1"}, in)
			s.unpin(in.pins...)
		}
		sb.check(t)
		checkErr(t, err, sb.base)
	})
}

// FuzzIndexManifest fuzzes an image index as a registry or a layout
// serves it, and the choice of this machine's platform in it.
func FuzzIndexManifest(f *testing.F) {
	for _, s := range indexSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		im, err := v1.ParseIndexManifest(bytes.NewReader(data))
		if err != nil {
			return
		}
		d, err := pickPlatform(im.Manifests, "fuzz")
		checkErr(t, err)
		if err == nil && !d.MediaType.IsImage() && !d.MediaType.IsIndex() {
			t.Fatalf("picked a %q", d.MediaType)
		}
	})
}

// Seeds.

func layerSeeds(t testing.TB) [][]byte {
	big := strings.Repeat("x", 300)
	return [][]byte{
		tarOf(t, dir("etc/"), file("etc/hello", "hi"), ent{name: "bin/su", typ: tar.TypeReg, body: "elf", mode: 0o4755},
			ent{name: "bin/sh", typ: tar.TypeSymlink, link: "/usr/bin/dash"}, ent{name: "bin/sh2", typ: tar.TypeLink, link: "bin/su"}),
		tarOf(t, file("../evil", "x")),
		tarOf(t, file("a/../../evil", "x")),
		tarOf(t, file("/abs/file", "x"), file("//etc/passwd", "x")),
		tarOf(t, ent{name: "esc", typ: tar.TypeSymlink, link: "../outside"}, file("esc/victim", "pwned"), file("esc/new", "pwned")),
		tarOf(t, ent{name: "esc", typ: tar.TypeSymlink, link: "/"}, file("esc/../../canary", "pwned")),
		tarOf(t, ent{name: "a", typ: tar.TypeSymlink, link: "../../../../../.."}, dir("a/b/")),
		tarOf(t, ent{name: "l", typ: tar.TypeLink, link: "../canary"}),
		tarOf(t, ent{name: "esc", typ: tar.TypeSymlink, link: "../outside"}, ent{name: "l", typ: tar.TypeLink, link: "esc/victim"}),
		tarOf(t, ent{name: "f", typ: tar.TypeSymlink, link: "../canary"}, file("f", "replaced")),
		tarOf(t, ent{name: "dev/sda", typ: tar.TypeBlock, major: 8}, ent{name: "dev/null", typ: tar.TypeChar, major: 1, minor: 3, mode: 0o666},
			ent{name: "dev/wh", typ: tar.TypeChar}, ent{name: "run/fifo", typ: tar.TypeFifo}, ent{name: "dev/null2", typ: tar.TypeLink, link: "dev/null"}),
		tarOf(t, ent{name: "dev/x", typ: tar.TypeChar, major: 99999, minor: 2097151}),
		tarOf(t, file("../.wh.canary", ""), file("etc/.wh.passwd", ""), file(".wh..wh..opq", ""), file("x/.wh..wh.plnk", "")),
		tarOf(t, ent{name: "esc", typ: tar.TypeSymlink, link: "../outside"}, file("esc/.wh.victim", "")),
		tarOf(t, ent{name: "esc", typ: tar.TypeSymlink, link: "../outside"}, file("esc/.wh..wh..opq", "")),
		tarOf(t, file(big+"/"+big, "long"), ent{name: "p", typ: tar.TypeReg, body: "x",
			pax: map[string]string{"SCHILY.xattr.trusted.overlay.redirect": "/etc", "SCHILY.xattr.security.capability": "\x01\x00\x00\x02", "SCHILY.xattr.user.x": big}}),
		tarOf(t, dir("d/"), file("d", "file over dir"), dir("d/")),
		sparseBomb(t), // 1TiB of holes in 2.5KiB: stopped at maxFuzzBytes
	}
}

// sparseBomb is a tar of one sparse file of 1TiB (one byte of data at
// 1GiB), without its end blocks.
func sparseBomb(t testing.TB) []byte {
	b := sparseTar(t, "bomb", 1<<40, 1<<30, []byte("x"))
	return b[:len(b)-1024]
}

// zstdBomb is a zstd layer blob of a few hundred bytes that decompresses
// to a tar just over maxFuzzBytes.
func zstdBomb(t testing.TB) []byte {
	return zstdOf(t, zeroTar(t, "zeros", maxFuzzBytes+1<<20))
}

func archiveSeeds(t testing.TB) [][]byte {
	oci := ociSeeds(t)[0]
	d := dockerSeeds(t)[0]
	return [][]byte{
		ociLayoutTar(t, oci.index, oci.manifest, oci.config, oci.layer),
		dockerArchiveTar(t, d.manifest, d.config, d.layer),
		archiveOf(t, "oci-layout", `{"imageLayoutVersion":"1.0.0"}`, "../../canary", "x"),
		[]byte("not an archive"),
		gzipOf(t, dockerArchiveTar(t, d.manifest, d.config, sparseBomb(t))), // gzipped, its layer a sparse bomb
	}
}

type ociSeed struct{ index, manifest, config, layer []byte }

func seedLayer(t testing.TB) []byte {
	return tarOf(t, file("etc/hello", "hi"), ent{name: "dev/null", typ: tar.TypeChar, major: 1, minor: 3})
}

func seedConfig() []byte {
	return []byte(`{"architecture":"` + runtime.GOARCH + `","os":"linux","config":{"Env":["PATH=/bin"],"Cmd":["/bin/sh"]},"rootfs":{"type":"layers","diff_ids":["` + phLayer + `"]}}`)
}

func ociSeeds(t testing.TB) []ociSeed {
	manifest := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",` +
		`"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"` + phConfig + `","size":` + phConfigSize + `},` +
		`"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"` + phLayer + `","size":` + phLayerSize + `}]}`)
	index := []byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"` + phManifest + `","size":` + phManSize + `,` +
		`"annotations":{"org.opencontainers.image.ref.name":"example.com/fuzz:1"}}]}`)
	// A manifest that is an index of the image's manifest: the layout
	// holds no such manifest, so its lookup fails.
	nested := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"` + phConfig + `","size":` + phConfigSize + `,"platform":{"os":"linux","architecture":"` + runtime.GOARCH + `"}}]}`)
	indexOfIndex := bytes.Replace(index, []byte("image.manifest.v1"), []byte("image.index.v1"), 1)
	return []ociSeed{
		{index, manifest, seedConfig(), seedLayer(t)},
		{indexOfIndex, nested, seedConfig(), seedLayer(t)},
		{index, manifest, []byte(`{"rootfs":{"diff_ids":[]}}`), seedLayer(t)},
		{index, manifest, seedConfig(), tarOf(t, file("../evil", "x"))},
		{[]byte(`{"manifests":[{"digest":"sha256:../../canary"}]}`), manifest, seedConfig(), seedLayer(t)},
		{index, manifest, seedConfig(), zstdBomb(t)},
	}
}

type dockerSeed struct{ manifest, config, layer []byte }

func dockerSeeds(t testing.TB) []dockerSeed {
	m := func(tags string) []byte {
		return []byte(`[{"Config":"config.json","RepoTags":[` + tags + `],"Layers":["layer.tar"]}]`)
	}
	return []dockerSeed{
		{m(`"example.com/fuzz:1"`), seedConfig(), seedLayer(t)},
		{m(``), seedConfig(), seedLayer(t)},
		{m(`"Bad:Ref"`), seedConfig(), seedLayer(t)},
		{[]byte(`[{"Config":"../../canary","Layers":["/etc/passwd"]}]`), seedConfig(), seedLayer(t)},
		{m(`"a:1"`), seedConfig(), tarOf(t, ent{name: "esc", typ: tar.TypeSymlink, link: "../outside"}, file("esc/x", "x"))},
		{m(`"a:1"`), seedConfig(), sparseBomb(t)},
	}
}

func configSeeds(t testing.TB) [][]byte {
	return [][]byte{
		[]byte(`{"architecture":"` + runtime.GOARCH + `","os":"linux","config":{"Env":["A=1"],"User":"1000:1000","WorkingDir":"/w"},"rootfs":{"type":"layers","diff_ids":[]}}`),
		[]byte(`{"os":"windows","rootfs":{"diff_ids":[]}}`),
		[]byte(`{"rootfs":{"diff_ids":["sha256:00"]}}`),
		[]byte(`{"created":"not a time"}`),
		[]byte(`null`),
	}
}

func indexSeeds(t testing.TB) [][]byte {
	d := "sha256:" + strings.Repeat("a", 64)
	return [][]byte{
		[]byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"` + d + `","size":1,"platform":{"os":"linux","architecture":"` + runtime.GOARCH + `"}},` +
			`{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"` + d + `","size":1,"platform":{"os":"unknown","architecture":"unknown"}}]}`),
		[]byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.docker.distribution.manifest.v2+json","digest":"` + d + `","size":1}]}`),
		[]byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"` + d + `","size":1,"platform":{"os":"linux","architecture":"arm64","variant":"v8"}}]}`),
		[]byte(`{"manifests":null}`),
	}
}

// TestWriteFuzzSeeds writes the seeds above as committed corpus files
// (testdata/fuzz/<FuzzName>/seed-N), for `go test -fuzz` and for plain
// `go test`, which runs every corpus file once.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("SHARD_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set SHARD_WRITE_FUZZ_SEEDS=1 to rewrite testdata/fuzz")
	}
	write := func(target string, seeds [][][]byte) {
		dir := filepath.Join("testdata", "fuzz", target)
		os.RemoveAll(dir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, args := range seeds {
			var b strings.Builder
			b.WriteString("go test fuzz v1\n")
			for _, a := range args {
				fmt.Fprintf(&b, "[]byte(%q)\n", a)
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(b.String()), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	one := func(seeds [][]byte) [][][]byte {
		var out [][][]byte
		for _, s := range seeds {
			out = append(out, [][]byte{s})
		}
		return out
	}
	write("FuzzUnpackLayer", one(layerSeeds(t)))
	write("FuzzImportArchive", one(archiveSeeds(t)))
	write("FuzzImageConfig", one(configSeeds(t)))
	write("FuzzIndexManifest", one(indexSeeds(t)))
	var oci, docker [][][]byte
	for _, s := range ociSeeds(t) {
		oci = append(oci, [][]byte{s.index, s.manifest, s.config, s.layer})
	}
	for _, s := range dockerSeeds(t) {
		docker = append(docker, [][]byte{s.manifest, s.config, s.layer})
	}
	write("FuzzImportOCILayout", oci)
	write("FuzzImportDockerArchive", docker)
}
