package kubernetes

import (
	"testing"

	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/spec"
)

// volumes: become PersistentVolumeClaim volumes mounted at their paths, beside the shared
// memory volume; config.kubernetes.custom_metadata labels and annotates the pod without
// overriding the keys List and Status find replicas by.
func TestPodVolumesAndCustomMetadata(t *testing.T) {
	ls := replicas.LaunchSpec{ReplicaID: "svc-3", Service: "svc", Version: 1, Run: "x",
		Volumes:        []spec.Volume{{Path: "/mnt/cache", Name: "model-cache"}, {Path: "/data", Name: "ds"}},
		PodLabels:      map[string]string{"team": "llm", LabelOwner: "someone-else"},
		PodAnnotations: map[string]string{"owner": "platform"}}
	pod := buildPod(ls, podSpec{namespace: "ns", owner: "arbiter-abc", image: "img", port: 8000, grace: 30}, 1, 0)
	claims := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			claims[v.Name] = v.PersistentVolumeClaim.ClaimName
		}
	}
	mounts := map[string]string{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		mounts[m.MountPath] = claims[m.Name]
	}
	if mounts["/mnt/cache"] != "model-cache" || mounts["/data"] != "ds" || len(claims) != 2 {
		t.Errorf("claims %v mounted as %v", claims, mounts)
	}
	if pod.Labels["team"] != "llm" || pod.Labels[LabelOwner] != "arbiter-abc" || pod.Annotations["owner"] != "platform" {
		t.Errorf("labels %v annotations %v", pod.Labels, pod.Annotations)
	}
}
