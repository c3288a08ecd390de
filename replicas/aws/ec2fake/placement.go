package ec2fake

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// Placement groups, CreateTags and the instance metadata service's tags, as the EC2 API
// Reference and User Guide describe them:
//
//   - CreatePlacementGroup: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreatePlacementGroup.html
//     (a name unique in the account's region, else InvalidPlacementGroup.Duplicate);
//   - DeletePlacementGroup: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DeletePlacementGroup.html
//     (InvalidPlacementGroup.Unknown for no such group, InvalidPlacementGroup.InUse while an
//     instance not terminated is in it);
//   - RunInstances' Placement.GroupName: a cluster group lies in one Availability Zone
//     (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-strategies.html), and
//     a launch into it that EC2 cannot fit answers InsufficientInstanceCapacity
//     (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/troubleshooting-launch.html);
//   - CreateTags: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateTags.html;
//   - IMDSv2 (a PUT for a session token, then GETs that carry it) and an instance's tags
//     under /latest/meta-data/tags/instance/ where the launch enabled them
//     (MetadataOptions.InstanceMetadataTags): https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html,
//     https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/work-with-tags-in-IMDS.html.
//
// An instance reaches its metadata at $ARBITER_IMDS (this server's /imds/<instance id>),
// where a real one reaches http://169.254.169.254.

type placementGroup struct {
	name, id, region, strategy, zoneID string
	tags                               map[string]string
}

// GroupCapacity makes a cluster placement group hold at most n instances: the launch of
// the next one into any group answers InsufficientInstanceCapacity, as EC2 does when it
// cannot fit another instance on the group's hardware; 0 lifts it.
func (s *Server) GroupCapacity(n int) {
	s.mu.Lock()
	s.groupCap = n
	s.mu.Unlock()
}

// PlacementGroups lists the placement groups by name, with their strategy and tags.
func (s *Server) PlacementGroups() map[string]map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[string]string{}
	for _, g := range s.groups {
		tags := map[string]string{"strategy": g.strategy}
		for k, v := range g.tags {
			tags[k] = v
		}
		out[g.name] = tags
	}
	return out
}

// InstanceGroup is the placement group an instance was launched into ("" for none).
func (s *Server) InstanceGroup(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in := s.instances[id]; in != nil {
		return in.group
	}
	return ""
}

type placementGroupXML struct {
	GroupName string   `xml:"groupName"`
	State     string   `xml:"state"`
	Strategy  string   `xml:"strategy"`
	GroupID   string   `xml:"groupId"`
	GroupArn  string   `xml:"groupArn"`
	Tags      []tagXML `xml:"tagSet>item"`
}

type createPlacementGroupResponse struct {
	XMLName xml.Name `xml:"CreatePlacementGroupResponse"`
	header
	Group placementGroupXML `xml:"placementGroup"`
}

type returnResponse struct {
	XMLName xml.Name
	header
	Return bool `xml:"return"`
}

func (s *Server) createPlacementGroup(region string, form url.Values) (any, *apiError) {
	name, strategy := form.Get("GroupName"), form.Get("Strategy")
	if name == "" {
		return nil, &apiError{400, "MissingParameter", "The request must contain the parameter GroupName"}
	}
	if strategy != "cluster" && strategy != "spread" && strategy != "partition" {
		return nil, &apiError{400, "InvalidParameterValue", fmt.Sprintf("Value (%s) for parameter strategy is invalid.", strategy)}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := region + "|" + name
	if _, ok := s.groups[key]; ok {
		return nil, &apiError{400, "InvalidPlacementGroup.Duplicate", fmt.Sprintf("The placement group '%s' already exists.", name)}
	}
	s.seq++
	g := &placementGroup{name: name, id: fmt.Sprintf("pg-%017x", 0xc000+s.seq), region: region, strategy: strategy, tags: tagSpecs(form)["placement-group"]}
	s.groups[key] = g
	x := placementGroupXML{GroupName: name, State: "available", Strategy: strategy, GroupID: g.id,
		GroupArn: fmt.Sprintf("arn:aws:ec2:%s:%s:placement-group/%s", region, ownerID, name)}
	for k, v := range g.tags {
		x.Tags = append(x.Tags, tagXML{k, v})
	}
	return &createPlacementGroupResponse{Group: x}, nil
}

func (s *Server) deletePlacementGroup(region string, form url.Values) (any, *apiError) {
	name := form.Get("GroupName")
	s.mu.Lock()
	defer s.mu.Unlock()
	key := region + "|" + name
	if _, ok := s.groups[key]; !ok {
		return nil, &apiError{400, "InvalidPlacementGroup.Unknown", fmt.Sprintf("The Placement Group '%s' is unknown.", name)}
	}
	for _, in := range s.instances {
		if in.region == region && in.group == name && in.state != "terminated" {
			return nil, &apiError{400, "InvalidPlacementGroup.InUse", fmt.Sprintf("There are running instances in the placement group '%s'.", name)}
		}
	}
	delete(s.groups, key)
	return &returnResponse{XMLName: xml.Name{Local: "DeletePlacementGroupResponse"}, Return: true}, nil
}

// placeLocked checks a launch into a placement group: the group exists, a cluster group
// stays in the zone of its first instance, and it has room (GroupCapacity).
func (s *Server) placeLocked(region, name string, z Zone, typ string) *apiError {
	g := s.groups[region+"|"+name]
	if g == nil {
		return &apiError{400, "InvalidPlacementGroup.Unknown", fmt.Sprintf("The Placement Group '%s' is unknown.", name)}
	}
	if g.strategy == "cluster" && g.zoneID != "" && g.zoneID != z.ID {
		return &apiError{400, "InvalidParameterCombination", fmt.Sprintf("The placement group '%s' is in another Availability Zone; a cluster placement group cannot span Availability Zones.", name)}
	}
	in := 0
	for _, i := range s.instances {
		if i.region == region && i.group == name && i.state != "terminated" && i.state != "shutting-down" {
			in++
		}
	}
	if s.groupCap > 0 && in >= s.groupCap {
		return &apiError{500, "InsufficientInstanceCapacity", fmt.Sprintf("We currently do not have sufficient %s capacity in the Availability Zone you requested (%s) for the placement group '%s'. Our system will be working on provisioning additional capacity.", typ, z.Name, name)}
	}
	g.zoneID = z.ID
	return nil
}

func (s *Server) createTags(region string, form url.Values) (any, *apiError) {
	ids := list(form, "ResourceId")
	tags := map[string]string{}
	for i := 1; ; i++ {
		k, ok := form[fmt.Sprintf("Tag.%d.Key", i)]
		if !ok {
			break
		}
		tags[k[0]] = form.Get(fmt.Sprintf("Tag.%d.Value", i))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if in := s.instances[id]; in == nil || in.region != region {
			return nil, &apiError{400, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id)}
		}
	}
	for _, id := range ids {
		for k, v := range tags {
			if len(v) > 256 {
				return nil, &apiError{400, "InvalidParameterValue", "Tag value exceeds the maximum length of 256 characters"}
			}
			s.instances[id].tags[k] = v
		}
	}
	return &returnResponse{XMLName: xml.Name{Local: "CreateTagsResponse"}, Return: true}, nil
}

// serveIMDS answers an instance's metadata requests: /imds/<id>/latest/api/token (PUT)
// and /imds/<id>/latest/meta-data/tags/instance/<key> with that token.
func (s *Server) serveIMDS(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, "/imds/")
	id, path, _ := strings.Cut(rest, "/")
	s.mu.Lock()
	in := s.instances[id]
	s.mu.Unlock()
	if in == nil || in.state != "running" {
		http.Error(w, "no such instance", http.StatusNotFound)
		return
	}
	if path == "latest/api/token" {
		if r.Method != http.MethodPut || r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds") == "" {
			http.Error(w, "", http.StatusBadRequest)
			return
		}
		var b [16]byte
		_, _ = rand.Read(b[:])
		tok := hex.EncodeToString(b[:])
		s.mu.Lock()
		in.imdsTokens = append(in.imdsTokens, tok)
		s.mu.Unlock()
		_, _ = w.Write([]byte(tok))
		return
	}
	s.mu.Lock()
	ok := false
	for _, t := range in.imdsTokens {
		ok = ok || t == r.Header.Get("X-aws-ec2-metadata-token")
	}
	tagsOn, tags := in.metadataTags, make(map[string]string, len(in.tags))
	for k, v := range in.tags {
		tags[k] = v
	}
	s.mu.Unlock()
	if !ok {
		http.Error(w, "", http.StatusUnauthorized) // IMDSv2 required: no token, no answer
		return
	}
	key, isTag := strings.CutPrefix(path, "latest/meta-data/tags/instance/")
	v, has := tags[key]
	if !isTag || !tagsOn || !has {
		http.Error(w, "Not Found", http.StatusNotFound)
		return
	}
	_, _ = w.Write([]byte(v))
}
