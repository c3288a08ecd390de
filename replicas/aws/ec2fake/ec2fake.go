// Package ec2fake is a stateful stand-in for Amazon EC2's Query API, for tests: the
// official SDK talks to it over real HTTP on loopback (ec2.Options.BaseEndpoint). It
// parses the form bodies the SDK sends (Action=…&Version=2016-11-15) and answers with XML
// shaped like the EC2 API Reference's response examples
// (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/, one page per action, cited on
// each handler), with EC2's error envelope
// (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html).
//
// It keeps instances and spot requests with their states and tags, and injects the faults
// a real account shows on purpose: capacity errors per zone and market, throttling, a quota,
// the eventual consistency of a just-created instance, and spot interruptions. An instance
// "boots" by running its user data with bash as a local process, told its address through
// ARBITER_HOST (a loopback address of its own, 127.0.0.N, reported as its private IP), its
// folder through ARBITER_DIR, and a home directory of its own (HOME, in that folder). Nothing it does leaves 127.0.0.0/8.
package ec2fake

import (
	"encoding/base64"
	"encoding/xml"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Zone is one availability zone of a region.
type Zone struct{ Name, ID string }

// Config shapes the fake account.
type Config struct {
	// Zones by region; the SDK's request names the region in its signature.
	Zones map[string][]Zone
	// SpotPrices by instance type and zone id (USD per hour), what
	// DescribeSpotPriceHistory answers.
	SpotPrices map[string]map[string]float64
	// Images DescribeImages knows (owner amazon).
	Images []Image
	// Dir holds each instance's folder and its script's output.
	Dir string
	// PendingFor is how long an instance stays pending before its user data runs.
	PendingFor time.Duration
	// ShuttingDownFor is how long a terminated instance stays shutting-down.
	ShuttingDownFor time.Duration
	// InvisibleFor is how long DescribeInstances answers InvalidInstanceID.NotFound for an
	// instance just created (EC2's eventual consistency).
	InvisibleFor time.Duration
	// Env is added to every instance's process environment (PATH to the test's binaries).
	Env []string
	// PageSize bounds DescribeInstances and DescribeSpotPriceHistory pages (default 5), so
	// callers must follow NextToken.
	PageSize int
	// Network is the first three octets of the instances' loopback addresses (127.0.61:
	// 127.0.61.1, .2, …); default: a random 127.x.y, so fakes in tests that run at once
	// (in one process or several) do not hand out the same address.
	Network string
	// Queues gives every region an SQS queue (QueueURL) that an EventBridge rule feeds
	// with EC2's spot interruption warnings and rebalance recommendations.
	Queues bool
	Log    *slog.Logger
}

// Image is an AMI.
type Image struct{ ID, Name, CreationDate string }

// Server is the fake endpoint; serve it with httptest.NewServer(s).
type Server struct {
	cfg Config

	mu        sync.Mutex
	seq       int
	instances map[string]*instance // by id
	spotReqs  map[string]*spotRequest
	tokens    map[string]string // client token → instance id
	// faults
	capacity  map[string]string // region|zone id|market → error code
	throttleN int
	quota     string         // error code every RunInstances answers, if set
	drop      map[string]int // action → replies to drop after doing the call
	calls     map[string]int
	requests  []url.Values
	queues    map[string]*queue          // by URL
	groups    map[string]*placementGroup // by region|name
	groupCap  int                        // instances a placement group holds (0: any)
}

type instance struct {
	id, region, zoneID, zoneName, typ, image, token string
	spot                                            bool
	spotReq                                         string
	ip                                              string
	state                                           string
	reasonCode, reasonMsg                           string
	tags                                            map[string]string
	launched, visibleAt                             time.Time
	userData                                        []byte
	cmd                                             *exec.Cmd
	exited                                          chan struct{}
	group                                           string // placement group
	metadataTags                                    bool   // tags in the instance metadata
	imdsTokens                                      []string
	imds                                            string // its metadata endpoint
}

type spotRequest struct {
	id, instance, state, code, msg string
	updated                        time.Time
	tags                           map[string]string
}

// New returns a fake account.
func New(cfg Config) *Server {
	if cfg.PageSize <= 0 {
		cfg.PageSize = 5
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Network == "" {
		cfg.Network = fmt.Sprintf("127.%d.%d", 100+rand.IntN(150), rand.IntN(256))
	}
	s := &Server{cfg: cfg, instances: map[string]*instance{}, spotReqs: map[string]*spotRequest{}, tokens: map[string]string{},
		capacity: map[string]string{}, calls: map[string]int{}, drop: map[string]int{}, queues: map[string]*queue{},
		groups: map[string]*placementGroup{}}
	if cfg.Queues {
		for region := range cfg.Zones {
			s.queueLocked(QueueURL(region))
		}
	}
	return s
}

// RefuseCapacity makes RunInstances in a zone (AZ id) and market ("spot" or "on-demand")
// answer code (InsufficientInstanceCapacity, …); "" lifts it.
func (s *Server) RefuseCapacity(region, zoneID, market, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := region + "|" + zoneID + "|" + market
	if code == "" {
		delete(s.capacity, k)
	} else {
		s.capacity[k] = code
	}
}

// Throttle makes the next n calls answer RequestLimitExceeded (HTTP 503), as EC2 does
// past an account's request rate.
func (s *Server) Throttle(n int) {
	s.mu.Lock()
	s.throttleN = n
	s.mu.Unlock()
}

// Quota makes every RunInstances answer code (VcpuLimitExceeded); "" lifts it.
func (s *Server) Quota(code string) {
	s.mu.Lock()
	s.quota = code
	s.mu.Unlock()
}

// DropReplies makes the next n calls of an action take effect but lose their answer (the
// connection closes first): the caller cannot tell whether the call was made.
func (s *Server) DropReplies(action string, n int) {
	s.mu.Lock()
	s.drop[action] = n
	s.mu.Unlock()
}

// Calls is how many times an action was called.
func (s *Server) Calls(action string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[action]
}

// Actions lists every action called so far.
func (s *Server) Actions() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.calls))
}

// Requests returns the forms of every call of an action, in order.
func (s *Server) Requests(action string) []url.Values {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []url.Values
	for _, f := range s.requests {
		if f.Get("Action") == action {
			out = append(out, f)
		}
	}
	return out
}

// Live lists the instances not terminated, with their tags.
func (s *Server) Live() map[string]map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[string]string{}
	for id, in := range s.instances {
		if in.state != "terminated" {
			out[id] = in.tags
		}
	}
	return out
}

// Interrupt reclaims a spot instance as EC2 does: its spot request is
// marked-for-termination now, EventBridge gets the "EC2 Spot Instance Interruption
// Warning" (sent to the region's queue when Config.Queues), and the instance is
// terminated after notice, with the state reason Server.SpotInstanceTermination
// (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-request-status.html,
// https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
func (s *Server) Interrupt(id string, notice time.Duration) error {
	s.mu.Lock()
	in := s.instances[id]
	if in == nil || !in.spot {
		s.mu.Unlock()
		return fmt.Errorf("ec2fake: %s is not a spot instance", id)
	}
	if r := s.spotReqs[in.spotReq]; r != nil {
		r.code, r.msg, r.updated = "marked-for-termination", "Spot Instance is marked for termination.", time.Now()
	}
	s.emitLocked(in, "EC2 Spot Instance Interruption Warning", map[string]string{"instance-id": id, "instance-action": "terminate"})
	s.mu.Unlock()
	time.AfterFunc(notice, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if r := s.spotReqs[in.spotReq]; r != nil {
			r.state, r.code, r.msg, r.updated = "closed", "instance-terminated-no-capacity", "Spot Instance terminated due to no available capacity.", time.Now()
		}
		s.terminateLocked(in, "Server.SpotInstanceTermination", "Server.SpotInstanceTermination: Spot instance termination")
	})
	return nil
}

// Close kills every instance's process.
func (s *Server) Close() {
	s.mu.Lock()
	var waits []chan struct{}
	for _, in := range s.instances {
		if in.cmd != nil && in.cmd.Process != nil {
			_ = syscall.Kill(-in.cmd.Process.Pid, syscall.SIGKILL)
			waits = append(waits, in.exited)
		}
	}
	s.mu.Unlock()
	for _, w := range waits {
		<-w
	}
}

var credentialRE = regexp.MustCompile(`Credential=[^/]+/\d{8}/([a-z0-9-]+)/(ec2|sqs)/aws4_request`)

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/imds/") {
		s.serveIMDS(w, r)
		return
	}
	reqID := fmt.Sprintf("%08x-fake-4000-8000-%012x", time.Now().UnixNano()&0xffffffff, time.Now().UnixNano())
	m := credentialRE.FindStringSubmatch(r.Header.Get("Authorization"))
	if r.Method != http.MethodPost || m == nil {
		// EC2 refuses an unsigned request.
		writeError(w, http.StatusUnauthorized, "AuthFailure", "AWS was not able to validate the provided access credentials", reqID)
		return
	}
	region := m[1]
	if action, ok := strings.CutPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS."); ok && m[2] == "sqs" {
		s.serveSQS(w, r, action)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, "InvalidParameterValue", err.Error(), reqID)
		return
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		writeError(w, http.StatusBadRequest, "InvalidParameterValue", err.Error(), reqID)
		return
	}
	action := form.Get("Action")
	s.mu.Lock()
	s.calls[action]++
	s.requests = append(s.requests, form)
	throttled := s.throttleN > 0
	if throttled {
		s.throttleN--
	}
	s.mu.Unlock()
	if throttled {
		writeError(w, http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded.", reqID)
		return
	}
	if _, ok := s.cfg.Zones[region]; !ok {
		// What EC2's global endpoint says of a region the account cannot use.
		writeError(w, http.StatusUnauthorized, "AuthFailure", "region "+region+" is not enabled for this account", reqID)
		return
	}
	var out any
	var ae *apiError
	switch action {
	case "RunInstances":
		out, ae = s.runInstances(region, form, "http://"+r.Host)
	case "CreatePlacementGroup":
		out, ae = s.createPlacementGroup(region, form)
	case "DeletePlacementGroup":
		out, ae = s.deletePlacementGroup(region, form)
	case "CreateTags":
		out, ae = s.createTags(region, form)
	case "DescribeInstances":
		out, ae = s.describeInstances(region, form)
	case "TerminateInstances":
		out, ae = s.terminateInstances(region, form)
	case "DescribeSpotInstanceRequests":
		out, ae = s.describeSpotRequests(region, form)
	case "DescribeSpotPriceHistory":
		out, ae = s.describeSpotPrices(region, form)
	case "DescribeAvailabilityZones":
		out = s.describeZones(region)
	case "DescribeImages":
		out = s.describeImages(form)
	default:
		ae = &apiError{http.StatusBadRequest, "InvalidAction", "The action " + action + " is not valid for this web service."}
	}
	if ae != nil {
		writeError(w, ae.status, ae.code, ae.msg, reqID)
		return
	}
	s.mu.Lock()
	drop := s.drop[action] > 0
	if drop {
		s.drop[action]--
	}
	s.mu.Unlock()
	if drop {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	setRequestID(out, reqID)
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	_, _ = io.WriteString(w, xml.Header)
	if err := xml.NewEncoder(w).Encode(out); err != nil {
		s.cfg.Log.Error("ec2fake: encode", "err", err)
	}
}

type apiError struct {
	status    int
	code, msg string
}

// writeError writes EC2's error envelope: Response/Errors/Error with Code and Message,
// and RequestID.
func writeError(w http.ResponseWriter, status int, code, msg, reqID string) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(status)
	type errXML struct {
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	}
	_ = xml.NewEncoder(w).Encode(struct {
		XMLName   xml.Name `xml:"Response"`
		Errors    []errXML `xml:"Errors>Error"`
		RequestID string   `xml:"RequestID"`
	}{Errors: []errXML{{code, msg}}, RequestID: reqID})
}

// list reads a flattened query list: prefix.1, prefix.2, …
func list(form url.Values, prefix string) []string {
	var out []string
	for i := 1; ; i++ {
		v, ok := form[prefix+"."+strconv.Itoa(i)]
		if !ok {
			return out
		}
		out = append(out, v[0])
	}
}

// filters reads Filter.N.Name and Filter.N.Value.M.
func filters(form url.Values) map[string][]string {
	out := map[string][]string{}
	for i := 1; ; i++ {
		name := form.Get("Filter." + strconv.Itoa(i) + ".Name")
		if name == "" {
			return out
		}
		out[name] = list(form, "Filter."+strconv.Itoa(i)+".Value")
	}
}

// tagSpecs reads TagSpecification.N.ResourceType and .Tag.M.Key/Value.
func tagSpecs(form url.Values) map[string]map[string]string {
	out := map[string]map[string]string{}
	for i := 1; ; i++ {
		p := "TagSpecification." + strconv.Itoa(i)
		rt := form.Get(p + ".ResourceType")
		if rt == "" {
			return out
		}
		tags := map[string]string{}
		for j := 1; ; j++ {
			k, ok := form[p+".Tag."+strconv.Itoa(j)+".Key"]
			if !ok {
				break
			}
			tags[k[0]] = form.Get(p + ".Tag." + strconv.Itoa(j) + ".Value")
		}
		out[rt] = tags
	}
}

func (s *Server) zone(region, name, id string) (Zone, bool) {
	for _, z := range s.cfg.Zones[region] {
		if (id != "" && z.ID == id) || (name != "" && z.Name == name) {
			return z, true
		}
	}
	return Zone{}, false
}

// runInstances: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_RunInstances.html
func (s *Server) runInstances(region string, form url.Values, endpoint string) (any, *apiError) {
	if form.Get("MinCount") != "1" || form.Get("MaxCount") != "1" {
		return nil, &apiError{400, "InvalidParameterValue", "this fake launches one instance a call"}
	}
	for _, k := range []string{"ImageId", "InstanceType"} {
		if form.Get(k) == "" {
			return nil, &apiError{400, "MissingParameter", "The request must contain the parameter " + k}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	token := form.Get("ClientToken")
	if id, ok := s.tokens[token]; ok && token != "" {
		// Idempotency: the same token answers the instance the first call made.
		in := s.instances[id]
		return &runInstancesResponse{ReservationID: "r-" + id[2:], OwnerID: ownerID, Instances: []instanceXML{s.instanceXML(in)}}, nil
	}
	if s.quota != "" {
		return nil, &apiError{400, s.quota, "You have requested more vCPU capacity than your current vCPU limit allows."}
	}
	z, ok := s.zone(region, form.Get("Placement.AvailabilityZone"), form.Get("Placement.AvailabilityZoneId"))
	if !ok {
		if form.Get("Placement.AvailabilityZone")+form.Get("Placement.AvailabilityZoneId") != "" {
			return nil, &apiError{400, "InvalidParameterValue", "Invalid availability zone"}
		}
		z = s.cfg.Zones[region][0]
	}
	spot := form.Get("InstanceMarketOptions.MarketType") == "spot"
	market := "on-demand"
	if spot {
		market = "spot"
		if form.Get("InstanceMarketOptions.SpotOptions.SpotInstanceType") != "one-time" ||
			form.Get("InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior") != "terminate" {
			return nil, &apiError{400, "InvalidParameterCombination", "this fake takes one-time spot requests terminated on interruption"}
		}
		if _, ok := s.cfg.SpotPrices[form.Get("InstanceType")][z.ID]; !ok {
			return nil, &apiError{400, "Unsupported", "The requested configuration is currently not supported. Please check the documentation for supported configurations."}
		}
	}
	if code := s.capacity[region+"|"+z.ID+"|"+market]; code != "" {
		return nil, &apiError{500, code, fmt.Sprintf("We currently do not have sufficient %s capacity in the Availability Zone you requested (%s).", form.Get("InstanceType"), z.Name)}
	}
	group := form.Get("Placement.GroupName")
	if group != "" {
		if ae := s.placeLocked(region, group, z, form.Get("InstanceType")); ae != nil {
			return nil, ae
		}
	}
	ud, err := base64.StdEncoding.DecodeString(form.Get("UserData"))
	if err != nil {
		return nil, &apiError{400, "InvalidParameterValue", "Invalid BASE64 encoding of user data."}
	}
	s.seq++
	now := time.Now()
	tags := tagSpecs(form)
	if tags["instance"] == nil {
		tags["instance"] = map[string]string{}
	}
	in := &instance{id: fmt.Sprintf("i-%017x", 0xa5000+s.seq), region: region, zoneID: z.ID, zoneName: z.Name, typ: form.Get("InstanceType"),
		image: form.Get("ImageId"), token: token, spot: spot, state: "pending", tags: tags["instance"],
		launched: now, visibleAt: now.Add(s.cfg.InvisibleFor), userData: ud, exited: make(chan struct{}),
		ip: fmt.Sprintf("%s.%d", s.cfg.Network, 1+s.seq%250), group: group,
		metadataTags: form.Get("MetadataOptions.InstanceMetadataTags") == "enabled"}
	in.imds = endpoint + "/imds/" + in.id
	if spot {
		in.spotReq = fmt.Sprintf("sir-%08x", 0xf00+s.seq)
		s.spotReqs[in.spotReq] = &spotRequest{id: in.spotReq, instance: in.id, state: "active", code: "fulfilled",
			msg: "Your spot request is fulfilled.", updated: now, tags: tags["spot-instances-request"]}
	}
	s.instances[in.id] = in
	if token != "" {
		s.tokens[token] = in.id
	}
	time.AfterFunc(s.cfg.PendingFor, func() { s.boot(in) })
	return &runInstancesResponse{ReservationID: "r-" + in.id[2:], OwnerID: ownerID, Instances: []instanceXML{s.instanceXML(in)}}, nil
}

const ownerID = "123456789012"

// boot runs the instance's user data as its own process group, as cloud-init would.
func (s *Server) boot(in *instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in.state != "pending" {
		return
	}
	dir := filepath.Join(s.cfg.Dir, in.id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.cfg.Log.Error("ec2fake: boot", "err", err)
		return
	}
	script := filepath.Join(dir, "user-data")
	if err := os.WriteFile(script, in.userData, 0o700); err != nil {
		s.cfg.Log.Error("ec2fake: boot", "err", err)
		return
	}
	out, err := os.Create(filepath.Join(dir, "cloud-init-output.log"))
	if err != nil {
		s.cfg.Log.Error("ec2fake: boot", "err", err)
		return
	}
	// Each VM has a home of its own (SkyPilot's ~/sky_workdir, relative file mounts).
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		s.cfg.Log.Error("ec2fake: boot", "err", err)
		return
	}
	cmd := exec.Command("bash", script)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), s.cfg.Env...), "ARBITER_HOST="+in.ip, "ARBITER_DIR="+dir, "ARBITER_IMDS="+in.imds, "HOME="+home)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		s.cfg.Log.Error("ec2fake: boot", "err", err)
		return
	}
	in.cmd, in.state = cmd, "running"
	go func() {
		_ = cmd.Wait()
		_ = out.Close()
		close(in.exited)
	}()
}

// terminateLocked moves an instance to shutting-down, kills its processes, and to
// terminated after ShuttingDownFor.
func (s *Server) terminateLocked(in *instance, code, msg string) {
	if in.state == "terminated" || in.state == "shutting-down" {
		return
	}
	in.state, in.reasonCode, in.reasonMsg = "shutting-down", code, msg
	if in.cmd != nil && in.cmd.Process != nil {
		_ = syscall.Kill(-in.cmd.Process.Pid, syscall.SIGKILL)
	}
	if r := s.spotReqs[in.spotReq]; r != nil && r.state == "active" {
		r.state, r.code, r.updated = "closed", "instance-terminated-by-user", time.Now()
	}
	time.AfterFunc(s.cfg.ShuttingDownFor, func() {
		if in.exited != nil && in.cmd != nil {
			<-in.exited
		}
		s.mu.Lock()
		in.state = "terminated"
		s.mu.Unlock()
	})
}

var stateCodes = map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}

func (s *Server) instanceXML(in *instance) instanceXML {
	x := instanceXML{InstanceID: in.id, ImageID: in.image, InstanceType: in.typ, ClientToken: in.token,
		State:      stateXML{Code: stateCodes[in.state], Name: in.state},
		Placement:  placementXML{AvailabilityZone: in.zoneName, AvailabilityZoneID: in.zoneID, GroupName: in.group, Tenancy: "default"},
		LaunchTime: in.launched.UTC().Format(time.RFC3339)}
	if in.state == "running" || in.state == "pending" {
		x.PrivateIPAddress = in.ip
	}
	if in.spot {
		x.InstanceLifecycle, x.SpotInstanceRequestID = "spot", in.spotReq
	}
	if in.reasonCode != "" {
		x.StateReason = &reasonXML{Code: in.reasonCode, Message: in.reasonMsg}
		x.Reason = in.reasonMsg
	}
	for _, k := range slices.Sorted(maps.Keys(in.tags)) {
		x.Tags = append(x.Tags, tagXML{k, in.tags[k]})
	}
	return x
}

// describeInstances: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstances.html
func (s *Server) describeInstances(region string, form url.Values) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := list(form, "InstanceId")
	now := time.Now()
	for _, id := range ids {
		in := s.instances[id]
		if in == nil || in.region != region || now.Before(in.visibleAt) {
			return nil, &apiError{400, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id)}
		}
	}
	fs := filters(form)
	var match []*instance
	for _, in := range s.instances {
		if in.region != region || now.Before(in.visibleAt) || (len(ids) > 0 && !slices.Contains(ids, in.id)) {
			continue
		}
		ok := true
		for name, vals := range fs {
			switch {
			case name == "instance-state-name":
				ok = ok && slices.Contains(vals, in.state)
			case strings.HasPrefix(name, "tag:"):
				v, has := in.tags[strings.TrimPrefix(name, "tag:")]
				ok = ok && has && slices.Contains(vals, v)
			default:
				return nil, &apiError{400, "InvalidParameterValue", "The filter '" + name + "' is invalid"}
			}
		}
		if ok {
			match = append(match, in)
		}
	}
	slices.SortFunc(match, func(a, b *instance) int { return strings.Compare(a.id, b.id) })
	page, next, ae := s.paginate(len(match), form)
	if ae != nil {
		return nil, ae
	}
	out := &describeInstancesResponse{NextToken: next}
	for _, in := range match[page[0]:page[1]] {
		out.Reservations = append(out.Reservations, reservationXML{ReservationID: "r-" + in.id[2:], OwnerID: ownerID, Instances: []instanceXML{s.instanceXML(in)}})
	}
	return out, nil
}

// paginate returns the [from, to) of n items that a call's NextToken and MaxResults ask
// for, and the next page's token.
func (s *Server) paginate(n int, form url.Values) ([2]int, string, *apiError) {
	from := 0
	if t := form.Get("NextToken"); t != "" {
		v, err := strconv.Atoi(strings.TrimPrefix(t, "page-"))
		if err != nil || v < 0 || v > n {
			return [2]int{}, "", &apiError{400, "InvalidNextToken", "The token '" + t + "' is invalid"}
		}
		from = v
	}
	size := s.cfg.PageSize
	if m, err := strconv.Atoi(form.Get("MaxResults")); err == nil && m > 0 && m < size {
		size = m
	}
	to := min(from+size, n)
	next := ""
	if to < n {
		next = "page-" + strconv.Itoa(to)
	}
	return [2]int{from, to}, next, nil
}

// terminateInstances: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_TerminateInstances.html
func (s *Server) terminateInstances(region string, form url.Values) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := list(form, "InstanceId")
	for _, id := range ids {
		if in := s.instances[id]; in == nil || in.region != region {
			return nil, &apiError{400, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id)}
		}
	}
	out := &terminateInstancesResponse{}
	for _, id := range ids {
		in := s.instances[id]
		prev := in.state
		s.terminateLocked(in, "Client.UserInitiatedShutdown", "Client.UserInitiatedShutdown: User initiated shutdown")
		out.Instances = append(out.Instances, stateChangeXML{InstanceID: id,
			Current: stateXML{stateCodes[in.state], in.state}, Previous: stateXML{stateCodes[prev], prev}})
	}
	return out, nil
}

// describeSpotRequests: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeSpotInstanceRequests.html
func (s *Server) describeSpotRequests(region string, form url.Values) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &describeSpotRequestsResponse{}
	for _, id := range list(form, "SpotInstanceRequestId") {
		r := s.spotReqs[id]
		if r == nil || s.instances[r.instance].region != region {
			return nil, &apiError{400, "InvalidSpotInstanceRequestID.NotFound", fmt.Sprintf("The spot instance request ID '%s' does not exist", id)}
		}
		in := s.instances[r.instance]
		x := spotRequestXML{ID: r.id, State: r.state, Type: "one-time", InstanceID: r.instance, LaunchedZone: in.zoneName,
			LaunchedZoneID: in.zoneID, InterruptionBehavior: "terminate", ProductDescription: "Linux/UNIX",
			Status: spotStatusXML{Code: r.code, Message: r.msg, UpdateTime: r.updated.UTC().Format(time.RFC3339)}}
		for k, v := range r.tags {
			x.Tags = append(x.Tags, tagXML{k, v})
		}
		out.Requests = append(out.Requests, x)
	}
	return out, nil
}

// describeSpotPrices: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeSpotPriceHistory.html
func (s *Server) describeSpotPrices(region string, form url.Values) (any, *apiError) {
	want := list(form, "InstanceType")
	var items []spotPriceXML
	now := time.Now().UTC().Format(time.RFC3339)
	for _, typ := range slices.Sorted(maps.Keys(s.cfg.SpotPrices)) {
		if len(want) > 0 && !slices.Contains(want, typ) {
			continue
		}
		for _, z := range s.cfg.Zones[region] {
			if v, ok := s.cfg.SpotPrices[typ][z.ID]; ok {
				items = append(items, spotPriceXML{InstanceType: typ, ProductDescription: "Linux/UNIX", SpotPrice: strconv.FormatFloat(v, 'f', 6, 64),
					Timestamp: now, AvailabilityZone: z.Name, AvailabilityZoneID: z.ID})
			}
		}
	}
	page, next, ae := s.paginate(len(items), form)
	if ae != nil {
		return nil, ae
	}
	return &describeSpotPricesResponse{Prices: items[page[0]:page[1]], NextToken: next}, nil
}

// describeZones: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeAvailabilityZones.html
func (s *Server) describeZones(region string) any {
	out := &describeZonesResponse{}
	for _, z := range s.cfg.Zones[region] {
		out.Zones = append(out.Zones, zoneXML{ZoneName: z.Name, ZoneID: z.ID, State: "available", RegionName: region,
			ZoneType: "availability-zone", OptInStatus: "opt-in-not-required", GroupName: region})
	}
	return out
}

// describeImages: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeImages.html
func (s *Server) describeImages(form url.Values) any {
	fs := filters(form)
	ids := list(form, "ImageId")
	out := &describeImagesResponse{}
	for _, im := range s.cfg.Images {
		if len(ids) > 0 && !slices.Contains(ids, im.ID) {
			continue
		}
		if pats, ok := fs["name"]; ok && !slices.ContainsFunc(pats, func(p string) bool { return globMatch(p, im.Name) }) {
			continue
		}
		out.Images = append(out.Images, imageXML{ImageID: im.ID, Name: im.Name, CreationDate: im.CreationDate, State: "available",
			Architecture: "x86_64", OwnerID: "898082745236", OwnerAlias: "amazon", RootDeviceName: "/dev/sda1", RootDeviceType: "ebs"})
	}
	return out
}

// globMatch is EC2's filter wildcard: * any run, ? one character.
func globMatch(pattern, s string) bool {
	re := "^" + strings.NewReplacer(`\*`, ".*", `\?`, ".").Replace(regexp.QuoteMeta(pattern)) + "$"
	ok, _ := regexp.MatchString(re, s)
	return ok
}
