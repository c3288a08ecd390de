package kubetest

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/arbiter-serve/arbiter/replicas/kubernetes/coreclient"
)

// lwsCRD is a stand-in for the LeaderWorkerSet CRD, written from the API's reference (see
// the file's header): the sigs.k8s.io/lws module is not served by the module proxy.
//
//go:embed leaderworkerset-crd.yaml
var lwsCRD []byte

const lwsGroupVersion = "leaderworkerset.x-k8s.io/v1"

// InstallLeaderWorkerSet installs the stand-in LeaderWorkerSet CRD and waits until the
// apiserver serves the API (discovery lists leaderworkersets), as on a cluster where
// the LWS project is installed. It starts no controller: see StartLWSController.
func (c *Cluster) InstallLeaderWorkerSet() {
	c.t.Helper()
	c.Apply("leaderworkerset-crd", string(lwsCRD))
	c.waitFor("the LeaderWorkerSet API to be served", time.Minute, func() error {
		ok, err := c.Admin.Serves(context.Background(), lwsGroupVersion, "leaderworkersets")
		if err == nil && !ok {
			err = fmt.Errorf("not in discovery yet")
		}
		return err
	})
}

// lws is what the stand-in controller reads of a LeaderWorkerSet.
type lws struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Replicas             *int32 `json:"replicas"`
		LeaderWorkerTemplate struct {
			LeaderTemplate *corev1.PodTemplateSpec `json:"leaderTemplate"`
			WorkerTemplate corev1.PodTemplateSpec  `json:"workerTemplate"`
			Size           *int32                  `json:"size"`
			RestartPolicy  string                  `json:"restartPolicy"`
		} `json:"leaderWorkerTemplate"`
	} `json:"spec"`
}

// LWSController is a TEST-ONLY SIMULATION of the LeaderWorkerSet controller, NOT the
// project's controller: the sigs.k8s.io/lws module (its reconcilers) cannot be fetched
// here, so this stands in for the part of its behaviour Arbiter relies on, as the API's
// reference documents it (https://lws.sigs.k8s.io/docs/reference/leaderworkerset.v1/,
// https://lws.sigs.k8s.io/docs/concepts/): for each group (replicas groups, index g) it
// creates the leader pod <name>-<g> from the leader template (the worker template if
// none) and workers <name>-<g>-<i>, i in 1..size-1, from the worker template; each pod
// gets the labels leaderworkerset.sigs.k8s.io/name, group-index, worker-index and
// group-key, the annotation size, and the variables LWS_LEADER_ADDRESS, LWS_GROUP_SIZE and
// LWS_WORKER_INDEX in each container. With restartPolicy RecreateGroupOnPodRestart, a group
// one of whose pods is gone is recreated whole: its other pods are deleted, then all are
// created again. It does not go through StatefulSets (the real controller does), run
// webhooks or default fields, or roll out template changes, and of the garbage collector's
// work it does only this: pods it creates for a LeaderWorkerSet deleted meanwhile are
// deleted again (nothing else in this cluster collects them). What it proves is
// only that Arbiter's object is valid against the API's schema and that Arbiter drives a
// group made the way the reference says the controller makes it.
type LWSController struct {
	c      *Cluster
	ns     string
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	started  map[string]bool // groups created at least once (name-g)
	recreats int             // groups recreated whole
}

// StartLWSController runs the simulated controller over namespace until the test ends.
func (c *Cluster) StartLWSController(namespace string) *LWSController {
	ctx, cancel := context.WithCancel(context.Background())
	l := &LWSController{c: c, ns: namespace, cancel: cancel, done: make(chan struct{}), started: map[string]bool{}}
	c.t.Cleanup(func() { cancel(); <-l.done })
	go l.loop(ctx)
	return l
}

// Recreated is how many groups the controller has recreated whole.
func (l *LWSController) Recreated() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recreats
}

func (l *LWSController) loop(ctx context.Context) {
	defer close(l.done)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if err := l.reconcile(ctx); err != nil && ctx.Err() == nil {
			l.c.t.Logf("simulated LeaderWorkerSet controller: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (l *LWSController) reconcile(ctx context.Context) error {
	var list struct {
		Items []lws `json:"items"`
	}
	if err := l.c.Admin.ListJSON(ctx, lwsGroupVersion, "leaderworkersets", l.ns, &list); err != nil {
		return err
	}
	for _, s := range list.Items {
		if s.DeletionTimestamp != nil {
			continue
		}
		groups, size := int32(1), int32(1)
		if s.Spec.Replicas != nil {
			groups = *s.Spec.Replicas
		}
		if s.Spec.LeaderWorkerTemplate.Size != nil {
			size = *s.Spec.LeaderWorkerTemplate.Size
		}
		for g := range groups {
			if err := l.group(ctx, &s, int(g), int(size)); err != nil {
				return err
			}
		}
	}
	return nil
}

// group brings one group to size pods, recreating it whole where it lost one.
func (l *LWSController) group(ctx context.Context, s *lws, g, size int) error {
	leader := s.Name + "-" + strconv.Itoa(g)
	names := []string{leader}
	for i := 1; i < size; i++ {
		names = append(names, leader+"-"+strconv.Itoa(i))
	}
	var have []string
	for _, n := range names {
		pod := &corev1.Pod{}
		err := l.c.Admin.Get(ctx, coreclient.Pods, s.Namespace, n, pod)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return err
		case pod.DeletionTimestamp == nil:
			have = append(have, n)
		default:
			have = append(have, n) // still going: wait for it
		}
	}
	if len(have) == size {
		return nil
	}
	l.mu.Lock()
	recreate := l.started[leader] && s.Spec.LeaderWorkerTemplate.RestartPolicy == "RecreateGroupOnPodRestart"
	l.mu.Unlock()
	if recreate && len(have) > 0 {
		// Recreate the group whole: delete what is left, then create all once it is gone.
		for _, n := range have {
			if err := l.c.Admin.Delete(ctx, coreclient.Pods, s.Namespace, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
		return nil
	}
	if recreate {
		l.mu.Lock()
		l.recreats++
		l.mu.Unlock()
	}
	for i, n := range names {
		if err := l.createPod(ctx, s, g, i, size, n, leader); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	// Deleted meanwhile: what the garbage collector would do to the pods it owned.
	if err := l.c.Admin.GetJSON(ctx, lwsGroupVersion, "leaderworkersets", s.Namespace, s.Name, nil); apierrors.IsNotFound(err) {
		for _, n := range names {
			_ = l.c.Admin.Delete(ctx, coreclient.Pods, s.Namespace, n, metav1.DeleteOptions{})
		}
		return nil
	}
	l.mu.Lock()
	l.started[leader] = true
	l.mu.Unlock()
	return nil
}

func (l *LWSController) createPod(ctx context.Context, s *lws, g, i, size int, name, leader string) error {
	tmpl := s.Spec.LeaderWorkerTemplate.WorkerTemplate
	if i == 0 && s.Spec.LeaderWorkerTemplate.LeaderTemplate != nil {
		tmpl = *s.Spec.LeaderWorkerTemplate.LeaderTemplate
	}
	// A deep copy, so that one pod's labels never become another's.
	b, err := json.Marshal(tmpl)
	if err != nil {
		return err
	}
	var t corev1.PodTemplateSpec
	if err := json.Unmarshal(b, &t); err != nil {
		return err
	}
	pod := &corev1.Pod{ObjectMeta: t.ObjectMeta, Spec: t.Spec}
	pod.Name, pod.Namespace = name, s.Namespace
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Labels["leaderworkerset.sigs.k8s.io/name"] = s.Name
	pod.Labels["leaderworkerset.sigs.k8s.io/group-index"] = strconv.Itoa(g)
	pod.Labels["leaderworkerset.sigs.k8s.io/worker-index"] = strconv.Itoa(i)
	pod.Labels["leaderworkerset.sigs.k8s.io/group-key"] = fmt.Sprintf("%x", sha1.Sum([]byte(s.Namespace+"/"+leader)))
	pod.Annotations["leaderworkerset.sigs.k8s.io/size"] = strconv.Itoa(size)
	if i > 0 {
		pod.Annotations["leaderworkerset.sigs.k8s.io/leader-name"] = leader
	}
	for c := range pod.Spec.Containers {
		pod.Spec.Containers[c].Env = append(pod.Spec.Containers[c].Env,
			corev1.EnvVar{Name: "LWS_LEADER_ADDRESS", Value: leader + "." + s.Name + "." + s.Namespace},
			corev1.EnvVar{Name: "LWS_GROUP_SIZE", Value: strconv.Itoa(size)},
			corev1.EnvVar{Name: "LWS_WORKER_INDEX", Value: strconv.Itoa(i)})
	}
	return l.c.Admin.Create(ctx, coreclient.Pods, s.Namespace, pod, &corev1.Pod{})
}
