from importpatch import Patch

# The plugin brings its own mypkg.kernels, as a hardware plugin brings vllm._custom_ops: in every
# process where the patch is on, the import of mypkg.kernels gives myplugin.kernels itself.
patch = Patch("my-kernels", doc="mypkg.kernels is myplugin.kernels (docs/examples/myplugin)")
patch.redirect("mypkg.kernels", "myplugin.kernels")
