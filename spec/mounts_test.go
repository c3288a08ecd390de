package spec

import (
	"reflect"
	"strings"
	"testing"
)

// The forms below are written here in the shapes SkyPilot's task YAML documents
// (docs.skypilot.co reference/yaml-spec: file_mounts, volumes, config, num_nodes), not
// copied from its files.

func TestFileMountForms(t *testing.T) {
	s := mustParse(t, minimal+`file_mounts:
  /data: ~/datasets/images
  models: ./models
`)
	if want := []FileMount{{Path: "/data", Source: "~/datasets/images"}, {Path: "models", Source: "./models"}}; !reflect.DeepEqual(s.FileMounts, want) {
		t.Errorf("file_mounts:\n got %+v\nwant %+v", s.FileMounts, want)
	}
	s = mustParse(t, minimal+`arbiter: {providers: [aws]}
file_mounts:
  /ckpt: s3://my-bucket/ckpt
  /weights:
    source: s3://weights-bucket
    mode: MOUNT_CACHED
  /named:
    name: named-bucket
    store: s3
`)
	want := []FileMount{
		{Path: "/ckpt", Source: "s3://my-bucket/ckpt", Store: "s3", Mode: "COPY"},
		{Path: "/weights", Source: "s3://weights-bucket", Store: "s3", Mode: "MOUNT_CACHED"},
		{Path: "/named", Source: "s3://named-bucket", Store: "s3", Mode: "MOUNT"},
	}
	if !reflect.DeepEqual(s.FileMounts, want) {
		t.Errorf("file_mounts:\n got %+v\nwant %+v", s.FileMounts, want)
	}
	checkRoundTrip(t, []byte(minimal+"file_mounts: {/a: /tmp/a, a: ~/a}\n"))
	checkRoundTrip(t, []byte(minimal+"file_mounts: {/b: s3://b/p, /c: {source: s3://c, mode: mount}}\narbiter: {providers: [aws]}\n"))
}

// SkyPilot fills envs (not secrets) into file_mounts when it reads the file: mount paths,
// sources and bucket names; --env overrides apply there too. A bucket named without store
// is looked up in the store of the cloud the replica runs on: S3 on the aws provider.
func TestFileMountEnvsAndNamedBuckets(t *testing.T) {
	src := minimal + `arbiter: {providers: [aws]}
envs:
  CKPT_BUCKET: s3://my-ckpts/run-7
  VECTORS: vector-shards
  ROOT: /vectors
file_mounts:
  /ckpt:
    source: $CKPT_BUCKET
    mode: COPY
  ${ROOT}:
    name: ${VECTORS}
  /cache/$VECTORS: s3://cache/${VECTORS}
  /named:
    name: plain-name
`
	s := mustParse(t, src)
	want := []FileMount{
		{Path: "/ckpt", Source: "s3://my-ckpts/run-7", Store: "s3", Mode: "COPY"},
		{Path: "/vectors", Source: "s3://vector-shards", Store: "s3", Mode: "MOUNT"},
		{Path: "/cache/vector-shards", Source: "s3://cache/vector-shards", Store: "s3", Mode: "COPY"},
		{Path: "/named", Source: "s3://plain-name", Store: "s3", Mode: "MOUNT"},
	}
	if !reflect.DeepEqual(s.FileMounts, want) {
		t.Errorf("file_mounts:\n got %+v\nwant %+v", s.FileMounts, want)
	}
	checkRoundTrip(t, []byte(src))

	// --env replaces the file's value before the source is classified.
	s, err := ParseWith("in.yaml", []byte(minimal+"arbiter: {providers: [aws]}\nenvs: {B: <your-bucket>}\nfile_mounts:\n  /lora: {source: $B, mode: MOUNT}\n"),
		Overrides{Envs: map[string]string{"B": "s3://lora-adapters"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []FileMount{{Path: "/lora", Source: "s3://lora-adapters", Store: "s3", Mode: "MOUNT"}}; !reflect.DeepEqual(s.FileMounts, want) {
		t.Errorf("with --env: %+v, want %+v", s.FileMounts, want)
	}
	// Secrets are not filled in (SkyPilot gives them to setup and run only): the
	// reference stays a local path, which the block form refuses.
	errs := parseErrors(t, minimal+"secrets: {B: s3://b}\nfile_mounts:\n  /d: {name: n, source: $B}\n")
	if len(errs) == 0 || !strings.Contains(errs[0].Msg, "a local source in the block form") {
		t.Errorf("secret in file_mounts: %v", errs)
	}
}

func TestVolumesConfigNumNodes(t *testing.T) {
	src := `volumes:
  /mnt/cache: model-cache
config:
  kubernetes:
    custom_metadata:
      labels: {team: llm}
      annotations: {owner: platform}
run: x
service: {replicas: 1}
arbiter: {providers: [kubernetes]}
`
	s := mustParse(t, src)
	if !reflect.DeepEqual(s.Volumes, []Volume{{"/mnt/cache", "model-cache"}}) ||
		!reflect.DeepEqual(s.Config.KubernetesLabels, map[string]string{"team": "llm"}) ||
		!reflect.DeepEqual(s.Config.KubernetesAnnotations, map[string]string{"owner": "platform"}) {
		t.Errorf("parsed %+v %+v", s.Volumes, s.Config)
	}
	if len(s.Warnings()) != 0 {
		t.Errorf("warnings: %v", s.Warnings())
	}
	checkRoundTrip(t, []byte(src))
	if s := mustParse(t, minimal); s.NumNodes != 1 {
		t.Errorf("num_nodes defaults to %d", s.NumNodes)
	}
	if s := mustParse(t, minimal+"num_nodes: 2\n"); s.NumNodes != 2 {
		t.Errorf("num_nodes: 2 read as %d", s.NumNodes)
	}
	checkRoundTrip(t, []byte(minimal+"num_nodes: 3\n"))
	// A kubernetes replica of N nodes is a pod group.
	if s := mustParse(t, minimal+"num_nodes: 2\narbiter: {providers: [kubernetes, kubernetes:gke]}\n"); s.NumNodes != 2 {
		t.Errorf("num_nodes: 2 on kubernetes read as %d", s.NumNodes)
	}
	if s := mustParse(t, minimal+"num_nodes: 16\narbiter: {providers: [aws]}\n"); s.NumNodes != 16 {
		t.Errorf("num_nodes: 16 on aws read as %d", s.NumNodes)
	}
}

// Each key a provider cannot honour is refused at its place, naming the key and the
// provider; none is dropped without a word.
func TestMountRefusals(t *testing.T) {
	tests := []struct {
		name, src string
		line, col int
		msg       string
	}{
		{"bucket on local", minimal + "file_mounts:\n  /data: s3://b\n", 5, 3, "file_mounts./data: the local provider does not mount buckets"},
		{"folder on kubernetes", minimal + "file_mounts:\n  /data: ~/d\narbiter: {providers: [kubernetes]}\n", 5, 3, "file_mounts./data: the kubernetes provider cannot copy a folder"},
		{"bucket on kubernetes", minimal + "file_mounts:\n  /data: s3://b\narbiter: {providers: [kubernetes]}\n", 5, 3, "the kubernetes provider does not mount buckets"},
		{"gcs on aws", minimal + "file_mounts:\n  /data: gs://b\narbiter: {providers: [aws]}\n", 5, 3, "the aws provider mounts S3 buckets only"},
		{"folder on aws", minimal + "file_mounts:\n  /data: /srv/d\narbiter: {providers: [aws]}\n", 5, 3, "the aws provider cannot copy a folder from this machine into its replicas; put it in a bucket and mount that (an S3 bucket"},
		{"volume on local", minimal + "volumes:\n  /mnt: pvc\n", 5, 3, "volumes./mnt: the local provider has no volumes"},
		{"volume on aws", minimal + "volumes:\n  /mnt: pvc\narbiter: {providers: [aws]}\n", 5, 3, "the aws provider has no volumes"},
		{"volume block", minimal + "volumes:\n  /mnt: {size: 10Gi}\narbiter: {providers: [kubernetes]}\n", 5, 9, "want the name of an existing volume"},
		{"volume relative", minimal + "volumes:\n  mnt: pvc\n", 5, 3, "volumes.mnt: a volume is mounted at an absolute path"},
		{"unknown scheme", minimal + "file_mounts:\n  /d: ftp://x\n", 5, 7, `"ftp://x" is not a bucket URL`},
		{"block with local source", minimal + "file_mounts:\n  /d: {name: n, source: ~/d}\n", 5, 25, "Arbiter does not do"},
		{"name without store on local", minimal + "file_mounts:\n  /d: {name: n}\n", 5, 3, `file_mounts./d: bucket "n" is named without store, to be found in the store of the cloud the replica runs on, and the local provider mounts no buckets`},
		{"name without store on kubernetes", minimal + "file_mounts:\n  /d: {name: n}\narbiter: {providers: [kubernetes]}\n", 5, 3, "the kubernetes provider mounts no buckets"},
		{"env-named bucket on local", minimal + "envs: {B: s3://ckpt}\nfile_mounts:\n  /d: {source: $B}\n", 6, 3, "file_mounts./d: the local provider does not mount buckets; sync it to a folder on this machine (aws s3 sync s3://ckpt DIR)"},
		{"pod_config on kubernetes", minimal + "config:\n  kubernetes:\n    pod_config: {spec: {}}\narbiter: {providers: [kubernetes]}\n", 6, 5, "config.kubernetes.pod_config: the kubernetes provider does not merge a pod_config"},
		{"ecc on aws", minimal + "config:\n  nvidia_gpus: {disable_ecc: true}\narbiter: {providers: [aws]}\n", 5, 17, "config.nvidia_gpus.disable_ecc: the aws provider"},
		{"unknown config key", minimal + "config:\n  kubernetes: {pod_confg: {}}\n", 5, 16, `unknown key "pod_confg" in config.kubernetes`},
		{"num_nodes past aws's limit", minimal + "num_nodes: 17\narbiter: {providers: [aws]}\n", 4, 12, "num_nodes: 17: the aws provider launches at most 16 nodes a replica"},
		{"num_nodes on runpod", minimal + "num_nodes: 2\narbiter: {providers: [local, runpod]}\n", 4, 12, "num_nodes: 2: the runpod provider launches a replica on one machine; run multi-node replicas on the local, kubernetes or aws provider"},
		{"num_nodes zero", minimal + "num_nodes: 0\n", 4, 12, "num_nodes: want an integer ≥ 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := parseErrors(t, tt.src)
			for _, e := range errs {
				if e.Line == tt.line && e.Column == tt.col && strings.Contains(e.Msg, tt.msg) {
					return
				}
			}
			t.Errorf("want %d:%d %q, got:\n%v", tt.line, tt.col, tt.msg, errs)
		})
	}
}

// A config key for a platform the service does not use is accepted, as SkyPilot accepts
// it on another cloud, with a warning at its place saying it has no effect.
func TestConfigWarnings(t *testing.T) {
	s := mustParse(t, minimal+"config:\n  kubernetes:\n    pod_config: {spec: {}}\n  gcp: {enable_gvnic: true}\n")
	w := s.Warnings()
	if len(w) != 2 || w[0].Line != 6 || !strings.Contains(w[0].Msg, "config.kubernetes.pod_config: has no effect: no provider in arbiter.providers (local)") ||
		w[1].Line != 7 || !strings.Contains(w[1].Msg, "config.gcp.enable_gvnic: has no effect: Arbiter has no provider it is about") {
		t.Errorf("warnings:\n%v", w)
	}
}

// An image on the local provider is not used (setup and run run on this machine): accepted,
// as SkyPilot files carry one for their clouds, with a warning at its place; none where
// every provider starts replicas from it.
func TestImageOnLocalWarns(t *testing.T) {
	s := mustParse(t, minimal+"resources:\n  image_id: docker:vllm/vllm-openai:v0.10.0\n  any_of:\n    - {image_id: docker:lmsysorg/sglang:latest}\n")
	w := s.Warnings()
	if len(w) != 2 || w[0].Line != 5 || w[0].Column != 13 || !strings.Contains(w[0].Msg, "resources.image_id: has no effect on the local provider, which runs setup and run on this machine, not in an image") ||
		w[1].Line != 7 || !strings.Contains(w[1].Msg, "image_id: has no effect on the local provider") {
		t.Errorf("warnings:\n%v", w)
	}
	if s := mustParse(t, minimal+"resources: {image_id: docker:vllm/vllm-openai}\narbiter: {providers: [kubernetes]}\n"); len(s.Warnings()) != 0 {
		t.Errorf("on kubernetes: %v", s.Warnings())
	}
	if s := mustParse(t, minimal+"arbiter: {providers: [sim]}\nresources: {image_id: docker:x}\n"); len(s.Warnings()) != 1 || !strings.Contains(s.Warnings()[0].Msg, "the sim provider") {
		t.Errorf("on sim: %v", s.Warnings())
	}
}
