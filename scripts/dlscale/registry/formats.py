"""The on-disk dataset formats dlscale.data reads (config `convergence.data_format`): the schema's
enum and the readers' dispatch both read this tuple."""

FORMATS = ("cifar_binary", "image_folder", "webdataset")
