"""sha256 of every file `k3 make-model --shape tiny --seed 0` writes (generator version 2).

Changing the generator changes these and invalidates tests/fixtures/oracles: regenerate both.
"""
TINY_SEED0 = {
    "config.json": "0afb597f1692d361d4699871242243d008e7b6c39aa4336cd9a1b7168beffcb2",
    "k3-tensor-sums.bin": "21ac29614885b2917ba44a8402a215a3f07b76dcde903e136c397dbc3a9d897a",
    "k3-test-model.json": "0574df788f14671355ee4f1a3375cd455a60e51af8ccea964b9848331944cf69",
    "model-00001-of-000015.safetensors": "d26144af25a24cde646efe275d3d495884e8a862440f3024073737510f93d489",
    "model-00002-of-000015.safetensors": "7ccd0addd810eb9086061fee30b455e63520cbaac7c3f1aa3c9369b046470c63",
    "model-00003-of-000015.safetensors": "aee6edf463c1fc5db78968b9c00aea7e9a2489a4e9ad23dc2fd8ae14dd1637a2",
    "model-00004-of-000015.safetensors": "614c2941b66de1ff93d9a2e9f1536d949b4fa9545cecff1f882047a0e747b404",
    "model-00005-of-000015.safetensors": "c403a80a971504b1f097a7b9b4fc8c7f9b011886b4401b2700030789901d935e",
    "model-00006-of-000015.safetensors": "9e085389592de87b511b410c12c000c099a4de6b7a77a3979ca9bb6f61920234",
    "model-00007-of-000015.safetensors": "0a5eb13b22f3a2ba1bee3c0a70ab8a8908889b96a29d48827803a20680fc8288",
    "model-00008-of-000015.safetensors": "8ea4615f9fc5e7fbbd43ad84432d596ce1172f68e14f93601c13ba81bd120e6b",
    "model-00009-of-000015.safetensors": "d40f209c8258d0fced72e4b709295da82c015187e4d69b40fdace269eb8347e2",
    "model-00010-of-000015.safetensors": "d2f040a2f2382b8a759fac0be258be4a3a732a0fdd2ae7a23eadf4de4af58ed8",
    "model-00011-of-000015.safetensors": "df21617b5804b7810124b68fdcf4985668c5d4402d917a27d010154884f05166",
    "model-00012-of-000015.safetensors": "5cddd631dd8f1104c8d677518de54d1b34412d3be6b7f27ae23e84bdd58e8149",
    "model-00013-of-000015.safetensors": "5e2e5a2fddd6cb0d26760d539fdd9e6cddb7e3ba4e38be2725d57b54a675579b",
    "model-00014-of-000015.safetensors": "9f5b038405a730e45f437a8ba1fa39c2b7f42e70e8a2c6fcd94b40c44cb51c24",
    "model-00015-of-000015.safetensors": "3e7899a5b246fc0aa693e0526730b974e38e33833b7c906c16f0a6a855bdecde",
    "model.safetensors.index.json": "9b438a83382b9db60c8230bdf68478160a88caf98486c09e046d773e9be11554",
    "tiktoken.model": "e66088df4cdb28fbad3c55ac5a7ae741bc402e732ed948eb096a8ed6f852768f",
    "tokenizer_config.json": "1fced9efd6362f5d202f4943200f5d59e67bb3b161bc89157f00296e6078babb",
}
