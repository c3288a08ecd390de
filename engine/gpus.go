package engine

import (
	"fmt"
	"slices"
	"strings"
)

// GPUSpec is what a vendor's data sheet says about one GPU: the ceilings a step's bytes and
// FLOPs are divided by. Every figure is the data sheet's (Source), dense (without 2:4
// sparsity: data sheets print the sparse figure with an asterisk, and this is half of it).
type GPUSpec struct {
	// Name is the lower-case name profiles use (l4, a100-80gb); Catalog is the accelerator
	// name in the price catalogs (pricing.Offer.Accelerator), "" where none lists it.
	Name, Catalog string
	// MemGB is the GPU memory the data sheet states (GB as the data sheet prints it).
	MemGB float64
	// MemTBs is the memory bandwidth (TB/s).
	MemTBs float64
	// BF16TFLOPS is the dense 16-bit tensor-core rate. T4 and V100 have no BF16: vLLM runs
	// a bf16 checkpoint there in FP16 (it refuses bfloat16 below compute capability 8.0 and
	// casts), so their figure is the FP16 tensor rate, the rate those runs get.
	BF16TFLOPS float64
	// FP8TFLOPS is the dense FP8 tensor rate; 0: no FP8 tensor cores (before Ada/Hopper).
	FP8TFLOPS float64
	// MAMFTFLOPS is the highest dense BF16 matmul rate measured on the card (mamfSource);
	// 0: not measured there, taken to reach the same share of its data sheet's rate as the
	// H100 SXM does.
	MAMFTFLOPS float64
	// MemShare is the share of its data-sheet bandwidth the card reached in one
	// memory-bound code run on every card (memShareSource); 0: not measured there, taken to
	// reach the H100 SXM's share.
	MemShare float64
	// LinkGBs is the bandwidth between GPUs of one machine as the data sheet states it
	// (both directions together): NVLink where the card has it, else its PCIe slot.
	LinkGBs float64
	// Link names that interconnect.
	Link string
	// Source is the data sheet the figures come from.
	Source string
}

// gpus are the data-sheet figures of the GPUs the catalogs price. The H100 and H200 rows
// are the cards measured in shared/data/gpu_profiles (an H100 SXM5 80GB HBM3, an H200 SXM
// 141GB); their measured read bandwidth and matmul rate are 74 % of the figures below
// (2.47 of 3.35 TB/s, 747 of 989 TFLOPS; 3.57 of 4.8, 788 of 989), the ratio the
// calibration carries to the other cards, scaled by each card's measured matmul share
// where one was measured (MAMFTFLOPS).
var gpus = []GPUSpec{
	{Name: "t4", Catalog: "T4", MemGB: 16, MemTBs: 0.320, BF16TFLOPS: 65, MemShare: 0.69, LinkGBs: 32, Link: "PCIe Gen3 x16",
		Source: "NVIDIA T4 Tensor Core GPU data sheet (https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf): 16 GB GDDR6, 320 GB/s, mixed-precision FP16/FP32 65 TFLOPS (no BF16, no FP8), PCIe Gen3 x16 32 GB/s"},
	{Name: "a10g", Catalog: "A10G", MemGB: 24, MemTBs: 0.600, BF16TFLOPS: 70, MemShare: 0.75, LinkGBs: 64, Link: "PCIe Gen4 x16",
		Source: "NVIDIA publishes no A10G data sheet (AWS's variant of the A10, g5 instances); memory and bandwidth as the A10's data sheet (https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf: 24 GB GDDR6, 600 GB/s, PCIe Gen4 64 GB/s), tensor rate 70 TFLOPS from Baseten's A10 vs A10G comparison (https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/), the A10's own being 125"},
	{Name: "l4", Catalog: "L4", MemGB: 24, MemTBs: 0.300, BF16TFLOPS: 121, FP8TFLOPS: 242.5, MemShare: 0.76, LinkGBs: 64, Link: "PCIe Gen4 x16",
		Source: "NVIDIA L4 Tensor Core GPU data sheet (https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet): 24 GB GDDR6, 300 GB/s, BF16 242 and FP8 485 TFLOPS with sparsity, PCIe Gen4 x16 64 GB/s"},
	{Name: "l40s", Catalog: "L40S", MemGB: 48, MemTBs: 0.864, BF16TFLOPS: 362.05, FP8TFLOPS: 733, MemShare: 0.67, LinkGBs: 64, Link: "PCIe Gen4 x16",
		Source: "NVIDIA L40S data sheet (https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413): 48 GB GDDR6, 864 GB/s, BF16 362.05 (733 sparse), FP8 733 (1,466 sparse) TFLOPS, PCIe Gen4 x16 64 GB/s"},
	{Name: "v100", Catalog: "V100", MemGB: 16, MemTBs: 0.900, BF16TFLOPS: 125, LinkGBs: 300, Link: "NVLink 2",
		Source: "NVIDIA Tesla V100 data sheet (https://images.nvidia.com/content/technologies/volta/pdf/tesla-volta-v100-datasheet-letter-fnl-web.pdf), SXM2 16 GB (AWS p3): HBM2 900 GB/s, tensor (FP16) 125 TFLOPS (no BF16, no FP8), NVLink 300 GB/s"},
	{Name: "v100-32gb", Catalog: "V100-32GB", MemGB: 32, MemTBs: 0.900, BF16TFLOPS: 125, LinkGBs: 300, Link: "NVLink 2",
		Source: "NVIDIA Tesla V100 data sheet (https://images.nvidia.com/content/technologies/volta/pdf/tesla-volta-v100-datasheet-letter-fnl-web.pdf), SXM2 32 GB: HBM2 900 GB/s, tensor (FP16) 125 TFLOPS, NVLink 300 GB/s"},
	{Name: "a100", Catalog: "A100", MemGB: 40, MemTBs: 1.555, BF16TFLOPS: 312, MAMFTFLOPS: 271.2, LinkGBs: 600, Link: "NVLink 3",
		Source: "NVIDIA A100 Tensor Core GPU data sheet (https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), A100 40GB SXM: HBM2 1,555 GB/s, BF16 312 TFLOPS (624 sparse), no FP8, NVLink 600 GB/s"},
	{Name: "a100-80gb", Catalog: "A100-80GB", MemGB: 80, MemTBs: 2.039, BF16TFLOPS: 312, MAMFTFLOPS: 271.2, MemShare: 0.77, LinkGBs: 600, Link: "NVLink 3",
		Source: "NVIDIA A100 Tensor Core GPU data sheet (https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), A100 80GB SXM: HBM2e 2,039 GB/s, BF16 312 TFLOPS (624 sparse), no FP8, NVLink 600 GB/s"},
	{Name: "a100-80gb-pcie", MemGB: 80, MemTBs: 1.935, BF16TFLOPS: 312, MAMFTFLOPS: 252.9, MemShare: 0.76, LinkGBs: 600, Link: "NVLink bridge",
		Source: "NVIDIA A100 Tensor Core GPU data sheet (https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), A100 80GB PCIe: HBM2e 1,935 GB/s, BF16 312 TFLOPS (624 sparse), no FP8, NVLink bridge for two GPUs 600 GB/s"},
	{Name: "h100", Catalog: "H100", MemGB: 80, MemTBs: 3.35, BF16TFLOPS: 989.5, FP8TFLOPS: 1979, MAMFTFLOPS: 794.5, MemShare: 0.80, LinkGBs: 900, Link: "NVLink 4",
		Source: "NVIDIA H100 Tensor Core GPU data sheet (https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet), H100 SXM: 80 GB HBM3, 3.35 TB/s, BF16 1,979 and FP8 3,958 TFLOPS with sparsity, NVLink 900 GB/s"},
	{Name: "h100-pcie", MemGB: 80, MemTBs: 2.0, BF16TFLOPS: 756, FP8TFLOPS: 1513, MemShare: 0.85, LinkGBs: 600, Link: "NVLink bridge",
		Source: "NVIDIA H100 Tensor Core GPU data sheet, 2022 edition (https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet), H100 PCIe: 80 GB HBM2e, 2 TB/s, BF16 1,513 and FP8 3,026 TFLOPS with sparsity, NVLink bridge 600 GB/s"},
	{Name: "h100-nvl", MemGB: 94, MemTBs: 3.9, BF16TFLOPS: 835.5, FP8TFLOPS: 1670.5, LinkGBs: 600, Link: "NVLink bridge",
		Source: "NVIDIA H100 Tensor Core GPU data sheet (https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet), H100 NVL: 94 GB HBM3, 3.9 TB/s, BF16 1,671 and FP8 3,341 TFLOPS with sparsity, NVLink bridge 600 GB/s"},
	{Name: "h200", Catalog: "H200", MemGB: 141, MemTBs: 4.8, BF16TFLOPS: 989.5, FP8TFLOPS: 1979, LinkGBs: 900, Link: "NVLink 4",
		Source: "NVIDIA H200 Tensor Core GPU data sheet (https://resources.nvidia.com/en-us-data-center-overview-mc/en-us-data-center-overview/hpc-datasheet-sc23-h200), H200 SXM: 141 GB HBM3e, 4.8 TB/s, BF16 1,979 and FP8 3,958 TFLOPS with sparsity, NVLink 900 GB/s"},
	{Name: "b200", Catalog: "B200", MemGB: 180, MemTBs: 8.0, BF16TFLOPS: 2250, FP8TFLOPS: 4500, LinkGBs: 1800, Link: "NVLink 5",
		Source: "NVIDIA DGX B200 data sheet (https://resources.nvidia.com/en-us-dgx-systems/dgx-b200-datasheet): 1,440 GB and 64 TB/s over 8 GPUs, FP8 72 PFLOPS with sparsity over 8; HGX B200 per-GPU dense BF16 2,250 and FP8 4,500 TFLOPS at 1,000 W (NVIDIA Blackwell architecture technical brief, tabulated at https://glennklockwood.com/garden/processors/B200); NVLink 5 1.8 TB/s"},
}

// GPUNames lists the GPUs a profile can be generated for, sorted.
func GPUNames() []string {
	out := make([]string, len(gpus))
	for i, g := range gpus {
		out[i] = g.Name
	}
	slices.Sort(out)
	return out
}

// LookupGPU finds a GPU by its profile name (a100-80gb) or the catalogs' accelerator name
// (A100-80GB), case-insensitively.
func LookupGPU(name string) (GPUSpec, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	for _, g := range gpus {
		if n == g.Name || (g.Catalog != "" && n == strings.ToLower(g.Catalog)) {
			return g, nil
		}
	}
	return GPUSpec{}, fmt.Errorf("unknown GPU %q: want one of %s", name, strings.Join(GPUNames(), ", "))
}

// mamfSource is where the MAMFTFLOPS figures come from: the mean of 100 iterations of the
// best shape torch found on each card (BF16, no sparsity; the memory size of the A100s is
// not stated, the SXM figure serves both SXM cards).
const mamfSource = "Stas Bekman, Machine Learning Engineering, \"Maximum Achievable Matmul FLOPS comparison table\" (BF16): A100 SXM 271.2 of 312 TFLOPS, A100 PCIe 252.9 of 312, H100 SXM 794.5 of 989 (github.com/stas00/ml-engineering, compute/accelerator/README.md at b9e29720eebd4aa946fa9678975385efbc90a777)"

// hopperMAMFShare is the share of its data-sheet BF16 rate the H100 SXM reaches in the
// best measured matmul (794.5 of 989 TFLOPS): the share the calibration, fitted on the
// H100 and H200, carries to other cards.
const hopperMAMFShare = 794.5 / 989

// memShareSource is where the MemShare figures come from: FluidX3D's single-GPU benchmark
// table, its D3Q19 lattice Boltzmann kernel in FP32 (153 bytes moved per cell update, memory
// bound), the bandwidth it reached as a share of the data sheet's. The A10G's is the A10's
// row (the A10G is AWS's variant of the A10, its 24 GB GDDR6 at 600 GB/s the same).
const memShareSource = "FluidX3D single-GPU benchmark table, FP32/FP32 column (ProjectPhysX/FluidX3D, README.md at 01d3cddab64185000907a072e4338c5f8232e0b9): H100 SXM5 80%, H100 PCIe 85%, A100 SXM4 80GB 77%, A100 PCIe 80GB 76%, L40S 67%, L4 76%, A10 75%, Tesla T4 69% of the data sheet's bandwidth"

// hopperMemShare is the H100 SXM's FluidX3D share (80 %), the card the calibration's memory
// efficiency was fitted on.
const hopperMemShare = 0.80

// memShare scales the card's data-sheet bandwidth by how much more (or less) of it the
// card reached than the H100 SXM did in the same memory-bound code: 1 for a card not
// measured.
func (g GPUSpec) memShare() float64 {
	if g.MemShare <= 0 {
		return 1
	}
	return g.MemShare / hopperMemShare
}

// matmulShare scales the card's data-sheet rate by how much more (or less) of it its
// best measured matmul reaches than the H100's does: 1 for a card not measured.
func (g GPUSpec) matmulShare() float64 {
	if g.MAMFTFLOPS <= 0 {
		return 1
	}
	return g.MAMFTFLOPS / g.BF16TFLOPS / hopperMAMFShare
}
