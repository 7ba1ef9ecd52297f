package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

// nodeCLI runs the shard CLI against node n's socket, in project proj.
func nodeCLI(t testing.TB, n *node, proj string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(need(t).bin, append([]string{"--socket", n.socket, "--project", proj}, args...)...)
	var o, er bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &er
	if err := cmd.Run(); err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("run shard %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return o.String(), er.String(), code
}

// TestClusterImages: an image imported on one node is its project's across
// the cluster. A create through any node, placed on any node, finds it: the
// node placed copies it from the node that imported it on the first use,
// checked against the digest etcd records; another project never sees it;
// its name is its project's alone; removed on its node, it is gone from
// every node.
func TestClusterImages(t *testing.T) {
	e := need(t)
	tc := startCluster(t, "3GiB", "3GiB", "3GiB")
	a, b, c := tc.nodes[0], tc.nodes[1], tc.nodes[2]
	ctx := ctxT(t)
	const proj, ref = "bars", "localhost/bars/busybox:1"
	inProj := func(n *node) *client.Client {
		cl, err := client.New(client.Options{Socket: n.socket, Project: proj})
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	onA, onB, onC := inProj(a), inProj(b), inProj(c)

	// Imported on a, through a's socket, as the issue did.
	archive := filepath.Join(t.TempDir(), "busybox.tar")
	if out, err := exec.Command("skopeo", "copy", "--src-tls-verify=false", "docker://"+e.registry+"/busybox:latest", "oci-archive:"+archive).CombinedOutput(); err != nil {
		t.Fatalf("skopeo: %v\n%s", err, out)
	}
	out, errOut, code := nodeCLI(t, a, proj, "image", "import", "--name", ref, archive)
	if code != 0 {
		t.Fatalf("import on a: %s", errOut)
	}
	f := strings.Fields(out)
	if len(f) != 2 || !strings.HasPrefix(f[1], "sha256:") {
		t.Fatalf("import on a printed %q", out)
	}
	digest := f[1]

	// Through b, placed on a: the CLI (which looks the image up first,
	// through b) and the API.
	out, errOut, code = nodeCLI(t, b, proj, "create", "--node", "a", "--name", "img-a", ref)
	if code != 0 {
		t.Fatalf("create --node a through b: %s", errOut)
	}
	if got := execVia2(t, onB, "img-a", "echo on $(hostname)"); !strings.HasPrefix(got, "on ") {
		t.Fatalf("exec in img-a: %q", got)
	}
	if sb, err := onB.Get(ctx, "img-a"); err != nil || sb.Node != "a" || sb.ImageDigest != digest {
		t.Fatalf("img-a: %+v %v", sb, err)
	}
	// Inspected through b or c: a's.
	for _, cl := range []*client.Client{onB, onC} {
		if img, err := cl.Image(ctx, ref); err != nil || img.Digest != digest {
			t.Fatalf("inspect through another node: %+v %v", img, err)
		}
	}

	// Through b, placed on c, which does not have it: c copies it from a.
	out, errOut, code = nodeCLI(t, b, proj, "create", "--node", "c", "--name", "img-c", ref)
	if code != 0 {
		t.Fatalf("create --node c through b: %s", errOut)
	}
	if got := execVia2(t, onB, "img-c", "echo copied"); got != "copied\n" {
		t.Fatalf("exec in img-c: %q", got)
	}
	if sb, err := onC.Get(ctx, "img-c"); err != nil || sb.Node != "c" || sb.ImageDigest != digest {
		t.Fatalf("img-c: %+v %v", sb, err)
	}
	if img, err := onC.Image(ctx, ref); err != nil || img.Digest != digest {
		t.Fatalf("c's copy: %+v %v", img, err)
	}

	// A copy whose content does not match the digest etcd records is
	// refused: a's layer blob is changed under it, and b (which has no
	// copy yet) refuses what a sends.
	blob := layerBlob(t, a, digest)
	orig, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(orig)
	bad[len(bad)/2] ^= 0xff
	if err := os.WriteFile(blob, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := onA.Create(ctx, client.CreateRequest{Image: ref, Node: "b"}); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("create on b from a tampered copy: %v", err)
	}
	if imgs := imports(t, onB); len(imgs) != 0 {
		t.Fatalf("b's images after refusing the copy: %+v", imgs)
	}
	if err := os.WriteFile(blob, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	onBNode, err := onA.Create(ctx, client.CreateRequest{Image: ref, Node: "b", Name: "img-b"})
	if err != nil || onBNode.Node != "b" {
		t.Fatalf("create on b once a's blob is whole again: %+v %v", onBNode, err)
	}
	execVia(t, onC, "img-b")

	// Placed where placement says, through c.
	placed, err := onC.Create(ctx, client.CreateRequest{Image: ref, Name: "img-placed"})
	if err != nil {
		t.Fatalf("create through c, placed: %v", err)
	}
	execVia(t, onA, placed.ID)

	// Another project never sees it, through any node, and may take its
	// name for an image of its own.
	other, err := client.New(client.Options{Socket: b.socket, Project: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Create(ctx, client.CreateRequest{Image: ref, Node: "c"}); codeOf(err) != "image_not_found" {
		t.Fatalf("project other's create of bars' import: %v", err)
	}
	if _, err := other.Image(ctx, ref); codeOf(err) != "image_not_found" {
		t.Fatalf("project other's inspect of bars' import: %v", err)
	}
	if _, err := other.ImportImage(ctx, bytes.NewReader(dockerSaveAs(t, ref, []byte("other's"))), ref); err != nil {
		t.Fatalf("project other's import under the same name: %v", err)
	}
	if err := other.RemoveImage(ctx, ref); err != nil {
		t.Fatalf("project other's remove: %v", err)
	}
	// In its own project the name is a's: another node's import under it
	// is refused.
	if _, err := onB.ImportImage(ctx, bytes.NewReader(dockerSaveAs(t, ref, []byte("b's"))), ref); codeOf(err) != "name_taken" {
		t.Fatalf("import on b under a name a's import holds: %v", err)
	}

	// An environment built on a from an import, used on another node:
	// the node copies the import with the environment's checkpoint.
	const envRef = "localhost/bars/busybox:env"
	if _, errOut, code := nodeCLI(t, a, proj, "image", "import", "--name", envRef, archive); code != 0 {
		t.Fatalf("import %s on a: %s", envRef, errOut)
	}
	if _, err := onA.CreateEnvironment(ctx, client.EnvironmentRequest{Name: "env-img", Image: envRef,
		Setup: [][]string{{"sh", "-c", "echo set-up > /root/marker"}}}); err != nil {
		t.Fatalf("environment from an import on a: %v", err)
	}
	fromEnv, err := onB.Create(ctx, client.CreateRequest{Environment: "env-img", Node: "c"})
	if err != nil || fromEnv.Node != "c" {
		t.Fatalf("create on c from a's environment of an import: %+v %v", fromEnv, err)
	}
	if got := execVia2(t, onB, fromEnv.ID, "cat /root/marker"); got != "set-up\n" {
		t.Fatalf("from the environment on c: marker %q", got)
	}
	if img, err := onC.Image(ctx, envRef); err != nil || img.Origin != "a" {
		t.Fatalf("c's copy of %s: %+v %v", envRef, img, err)
	}
	if err := onB.Remove(ctx, fromEnv.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := onB.RemoveEnvironment(ctx, "env-img"); err != nil {
		t.Fatal(err)
	}

	// Removed on a (through c): refused while a sandbox anywhere uses it,
	// then gone from every node, also from one that was down meanwhile.
	for _, id := range []string{"img-a", "img-b", placed.ID} {
		if err := onC.Remove(ctx, id, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := onC.RemoveImage(ctx, ref); codeOf(err) != "image_in_use" || !strings.Contains(err.Error(), "node c") {
		t.Fatalf("remove while c's sandbox uses its copy: %v", err)
	}
	if err := onC.Remove(ctx, "img-c", true); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := nodeCLI(t, c, proj, "image", "rm", ref); code != 0 {
		t.Fatalf("image rm through c: %s", errOut)
	}
	// A node that is down while an import is removed keeps its copy, and
	// drops it when it joins again: c's copy of envRef.
	c.stop(t)
	if err := onB.RemoveImage(ctx, envRef); err != nil {
		t.Fatalf("remove %s through b while c is down: %v", envRef, err)
	}
	c.start(t)
	for _, n := range []*node{a, b, c} {
		for _, r := range []string{ref, envRef} {
			if _, err := inProj(n).Image(ctx, r); codeOf(err) != "image_not_found" {
				t.Fatalf("after its removal, %s on node %s: %v", r, n.name, err)
			}
		}
		if imgs := imports(t, inProj(n)); len(imgs) != 0 {
			t.Fatalf("after its removal, node %s lists %+v", n.name, imgs)
		}
	}
	if _, err := onB.Create(ctx, client.CreateRequest{Image: ref, Node: "c"}); codeOf(err) != "image_not_found" {
		t.Fatalf("create after its removal: %v", err)
	}
	// ... and the name is free for another node's import.
	if _, err := onB.ImportImage(ctx, bytes.NewReader(dockerSaveAs(t, ref, []byte("b's"))), ref); err != nil {
		t.Fatalf("import on b once a's is gone: %v", err)
	}
}

// layerBlob is the path of the first layer blob of the image manifest
// digest in node n's image store.
func layerBlob(t testing.TB, n *node, digest string) string {
	t.Helper()
	blobs := filepath.Join(n.dir, "data", "images", "blobs", "sha256")
	raw, err := os.ReadFile(filepath.Join(blobs, strings.TrimPrefix(digest, "sha256:")))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Layers []struct {
			Digest string `json:"digest"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(raw, &m); err != nil || len(m.Layers) == 0 {
		t.Fatalf("manifest %s: %v", digest, err)
	}
	return filepath.Join(blobs, strings.TrimPrefix(m.Layers[0].Digest, "sha256:"))
}

// imports are the imported images cl's project sees on its node.
func imports(t testing.TB, cl *client.Client) []client.Image {
	t.Helper()
	all, err := cl.Images(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []client.Image
	for _, i := range all {
		if i.Project != "" {
			out = append(out, i)
		}
	}
	return out
}
